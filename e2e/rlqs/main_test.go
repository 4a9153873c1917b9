// Package rlqs tests sluice's Rate Limit Quota Service with real processes:
// Envoy's own rate_limit_quota filter, sluice-controlplane and redis-server.
package rlqs

import (
	"flag"
	"os"
	"testing"

	"github.com/sluicehq/sluice/e2e/stack"
)

// controlPlane is the sluice-controlplane binary TestMain builds.
var controlPlane string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(stack.RunWithControlPlane("e2e/rlqs", testing.Short(), &controlPlane, nil, m.Run))
}
