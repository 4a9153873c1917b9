//go:build wasip1 && !sluicetest

package main

import (
	"github.com/sluicehq/sluice/filter/plugin"
	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// newHost returns the proxy the plugin talks to.
func newHost() plugin.Host { return abi.NewHost() }
