package host

import (
	"context"
	"strings"
	"testing"
)

// The tests below load tiny modules assembled by hand, to check what New
// refuses before any guest code runs.

// uleb appends v in unsigned LEB128.
func uleb(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// wasmName appends a length-prefixed name.
func wasmName(b []byte, s string) []byte { return append(uleb(b, uint32(len(s))), s...) }

// section appends a section with its size.
func section(b []byte, id byte, body []byte) []byte {
	b = append(b, id)
	b = uleb(b, uint32(len(body)))
	return append(b, body...)
}

// funcType encodes a function type of i32 params and results.
func funcType(params, results int) []byte {
	b := []byte{0x60}
	b = uleb(b, uint32(params))
	for i := 0; i < params; i++ {
		b = append(b, 0x7f)
	}
	b = uleb(b, uint32(results))
	for i := 0; i < results; i++ {
		b = append(b, 0x7f)
	}
	return b
}

// testModule is a module description for buildModule.
type testModule struct {
	imports    map[string]int // env function name -> number of i32 params (result i32)
	abiExport  string         // e.g. "proxy_abi_version_0_2_1"; "" for none
	allocParam int            // params of proxy_on_memory_allocate (1 in the ABI)
	noAlloc    bool           // export no allocator
}

// buildModule assembles the module: memory, the ABI marker, an allocator
// that returns 0, and the requested env imports.
func buildModule(m testModule) []byte {
	var types, imps, funcs, exps, code []byte
	var nTypes, nImps, nExps uint32
	addType := func(params, results int) uint32 {
		types = append(types, funcType(params, results)...)
		nTypes++
		return nTypes - 1
	}
	for name, params := range m.imports {
		ti := addType(params, 1)
		imps = wasmName(imps, "env")
		imps = wasmName(imps, name)
		imps = append(imps, 0x00)
		imps = uleb(imps, ti)
		nImps++
	}
	// Defined functions: 0: ABI marker () -> (), 1: allocator.
	marker := addType(0, 0)
	alloc := addType(m.allocParam, 1)
	funcs = uleb(uleb(uleb(funcs, 2), marker), alloc)
	code = uleb(code, 2)
	code = append(code, 2, 0x00, 0x0b)             // no locals, end
	code = append(code, 4, 0x00, 0x41, 0x00, 0x0b) // no locals, i32.const 0, end
	addExport := func(name string, kind byte, idx uint32) {
		exps = wasmName(exps, name)
		exps = append(exps, kind)
		exps = uleb(exps, idx)
		nExps++
	}
	addExport("memory", 0x02, 0)
	if m.abiExport != "" {
		addExport(m.abiExport, 0x00, nImps)
	}
	if !m.noAlloc {
		addExport("proxy_on_memory_allocate", 0x00, nImps+1)
	}

	b := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	b = section(b, 1, append(uleb(nil, nTypes), types...))
	if nImps > 0 {
		b = section(b, 2, append(uleb(nil, nImps), imps...))
	}
	b = section(b, 3, funcs)
	b = section(b, 5, []byte{1, 0x00, 1}) // one memory, min 1 page
	b = section(b, 7, append(uleb(nil, nExps), exps...))
	b = section(b, 10, code)
	return b
}

func TestLoadRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  testModule
		want string
	}{
		{"unimplemented import", testModule{
			imports:   map[string]int{"proxy_log": 3, "proxy_grpc_call": 12},
			abiExport: "proxy_abi_version_0_2_1", allocParam: 1,
		}, "imports env.proxy_grpc_call, which this host does not implement"},
		{"wrong import signature", testModule{
			imports:   map[string]int{"proxy_log": 2},
			abiExport: "proxy_abi_version_0_2_1", allocParam: 1,
		}, "imports env.proxy_log with signature (i32, i32) -> (i32)"},
		{"no ABI marker", testModule{abiExport: "", allocParam: 1}, "does not export proxy_abi_version_0_2_1"},
		{"old ABI", testModule{abiExport: "proxy_abi_version_0_1_0", allocParam: 1}, "advertises proxy_abi_version_0_1_0"},
		{"no allocator", testModule{abiExport: "proxy_abi_version_0_2_1", noAlloc: true}, "neither proxy_on_memory_allocate nor malloc"},
		{"wrong callback signature", testModule{abiExport: "proxy_abi_version_0_2_1", allocParam: 2}, "exports proxy_on_memory_allocate with signature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(context.Background(), Config{Wasm: buildModule(tc.mod)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestLoadAcceptsMinimalModule(t *testing.T) {
	h, err := New(context.Background(), Config{Wasm: buildModule(testModule{
		imports:   map[string]int{"proxy_log": 3, "proxy_continue_request": 0, "proxy_continue_stream": 1},
		abiExport: "proxy_abi_version_0_2_0", allocParam: 1,
	})})
	if err != nil {
		t.Fatalf("New refused a minimal ABI 0.2.0 module: %v", err)
	}
	defer h.Close(context.Background())
	// No callbacks exported: every stream just continues.
	st, err := h.Pick().NewStream(StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if d := st.RequestHeaders(Headers{{":path", "/"}}, true); d.Kind != DecisionContinue {
		t.Fatalf("decision %v", d.Kind)
	}
	st.Finish()
}
