// Command ratelimit-peer builds envoyproxy/ratelimit's service, unchanged, as
// the peer that bench/rls-compare.sh measures sluice against. It only imports
// the upstream runner (as upstream's src/service_cmd does) and is configured
// entirely by upstream's environment variables (settings.NewSettings).
//
// This folder is its own Go module so that the main module's ./... (and
// `make test`) never builds it: it is bench-only.
package main

import (
	"github.com/envoyproxy/ratelimit/src/service_cmd/runner"
	"github.com/envoyproxy/ratelimit/src/settings"
)

func main() {
	r := runner.NewRunner(settings.NewSettings())
	r.Run()
}
