package abi

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/tetratelabs/wazero"
)

// testedWASI are the WASI functions filter.wasm imports today, every one of
// which the Envoy versions the README claims (tested: 1.36.2 to 1.40.0)
// provide. The Go runtime imports more of them as a module uses more of the
// standard library (files, for one), and an Envoy without one refuses the
// module at load time; Envoy stubbed all of those only from 1.39.
var testedWASI = []string{
	"args_get", "args_sizes_get", "clock_time_get", "environ_get", "environ_sizes_get",
	"fd_write", "poll_oneoff", "proc_exit", "random_get", "sched_yield",
}

// TestWASIImports fails when filter.wasm starts importing a WASI function
// beyond testedWASI: then the oldest Envoy version the README claims must
// be tested again (ENVOY_BIN=... go test ./envoy/ ./e2e/...), and the claim
// and this list changed.
func TestWASIImports(t *testing.T) {
	progs, _ := programs(t)
	bin, err := os.ReadFile(progs.Wasm)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	m, err := r.CompileModule(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod == "wasi_snapshot_preview1" && !slices.Contains(testedWASI, name) {
			t.Errorf("filter.wasm imports %s.%s, which the oldest Envoy in the README was not tested with", mod, name)
		}
	}
}
