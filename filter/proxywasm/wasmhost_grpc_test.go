package main

import (
	"context"

	"github.com/tetratelabs/wazero/api"
)

// exportGRPC adds the host functions of proxy_grpc_call to the test host:
// a call is recorded as an HTTP call is (h.calls), and the answer is
// delivered by deliverGRPC or closeGRPC.
func (h *wasmHost) exportGRPC(export func(name string, params []api.ValueType, f api.GoModuleFunc)) {
	export("proxy_grpc_call", []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		h.calls = append(h.calls, h.current)
		h.grpcCalls++
		m.Memory().WriteUint32Le(uint32(s[11]), uint32(len(h.calls)))
		s[0] = 0
	})
	export("proxy_get_status", []api.ValueType{i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		m.Memory().WriteUint32Le(uint32(s[0]), h.grpcStatus)
		s[0] = h.giveString(m, h.grpcMessage, uint32(s[1]), uint32(s[2]))
	})
}

// deliverGRPC delivers msg, a bare response message, to gRPC call callID.
func (h *wasmHost) deliverGRPC(callID uint32, msg []byte) {
	h.answer = &hostAnswer{body: msg}
	h.current = 1
	h.call("proxy_on_grpc_receive", 1, uint64(callID), uint64(len(msg)))
	h.answer = nil
}
