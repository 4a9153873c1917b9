package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The tests of this package run filter.wasm itself: under the tetratelabs
// proxytest emulator (an independent host implementation) and under a small
// wazero host of our own (for the allocation check and the benchmark).

var (
	filterWasm    []byte // the production build
	filterWasmDev []byte // with the sluicetest tag: exports sluice_test_mallocs
	wasmDir       string // where TestMain builds them
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-filter-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	wasmDir = dir
	code := func() int {
		defer os.RemoveAll(dir)
		var err error
		if filterWasm, err = prebuiltWasm("SLUICE_BENCH_WASM"); err != nil || filterWasm != nil {
			if err == nil {
				filterWasmDev, err = prebuiltWasm("SLUICE_BENCH_WASM_DEV")
			}
			if err == nil && filterWasmDev == nil {
				err = errors.New("SLUICE_BENCH_WASM_DEV must be set with SLUICE_BENCH_WASM")
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			return m.Run()
		}
		if filterWasm, err = buildWasm(dir, "filter.wasm"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if filterWasmDev, err = buildWasm(dir, "filter-dev.wasm", "-tags", "sluicetest"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// prebuiltWasm reads the module named by environment variable env, nil if
// it is unset. SLUICE_BENCH_WASM and SLUICE_BENCH_WASM_DEV (the build with
// the sluicetest tag) let benchmarks compare builds made elsewhere, e.g. of
// an older revision, instead of building the current source.
func prebuiltWasm(env string) ([]byte, error) {
	path := os.Getenv(env)
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", env, err)
	}
	return b, nil
}

// buildWasm builds the filter as wasm-build.sh does.
func buildWasm(dir, name string, flags ...string) ([]byte, error) {
	out := filepath.Join(dir, name)
	args := append([]string{"build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w", "-o", out}, flags...)
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building %s: %v\n%s", name, err, msg)
	}
	return os.ReadFile(out)
}

func TestModuleSize(t *testing.T) {
	const goal = 3 << 20
	t.Logf("filter.wasm: %d bytes", len(filterWasm))
	if len(filterWasm) > goal {
		t.Fatalf("filter.wasm is %d bytes, over the %d-byte goal", len(filterWasm), goal)
	}
}

// uleb reads an unsigned LEB128 number.
func uleb(b []byte) (uint64, int, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, 0, errors.New("bad LEB128")
	}
	return v, n, nil
}

// withStartInitialize returns the module with a start section that calls its
// exported _initialize, for hosts that instantiate a module without calling
// _initialize (proxytest). The start section goes right after the export
// section, as the binary format orders sections.
func withStartInitialize(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return nil, errors.New("not a wasm module")
	}
	out := append([]byte(nil), wasm[:8]...)
	rest := wasm[8:]
	inserted := false
	for len(rest) > 0 {
		id := rest[0]
		size, n, err := uleb(rest[1:])
		if err != nil || uint64(len(rest)) < 1+uint64(n)+size {
			return nil, errors.New("truncated section")
		}
		section := rest[:1+n+int(size)]
		payload := section[1+n:]
		rest = rest[len(section):]
		if id == 8 {
			return nil, errors.New("the module already has a start section")
		}
		out = append(out, section...)
		if id != 7 {
			continue
		}
		index, err := exportedFunc(payload, "_initialize")
		if err != nil {
			return nil, err
		}
		body := binary.AppendUvarint(nil, index)
		out = append(out, 8)
		out = binary.AppendUvarint(out, uint64(len(body)))
		out = append(out, body...)
		inserted = true
	}
	if !inserted {
		return nil, errors.New("no export section")
	}
	return out, nil
}

// exportedFunc returns the function index of an export.
func exportedFunc(exports []byte, name string) (uint64, error) {
	count, n, err := uleb(exports)
	if err != nil {
		return 0, err
	}
	p := exports[n:]
	for i := uint64(0); i < count; i++ {
		l, n, err := uleb(p)
		if err != nil || uint64(len(p)) < uint64(n)+l+1 {
			return 0, errors.New("bad export")
		}
		export := string(p[n : n+int(l)])
		kind := p[n+int(l)]
		p = p[n+int(l)+1:]
		index, n2, err := uleb(p)
		if err != nil {
			return 0, err
		}
		p = p[n2:]
		if export == name && kind == 0 {
			return index, nil
		}
	}
	return 0, errors.New("no exported function " + name)
}
