// Package core is sluice's filter without its host: the request pipeline
// that decides each request, written once for the two hosts that run it,
// filter.wasm (package filter/proxywasm, a proxy-wasm filter) and the
// native Envoy dynamic module (package filter/native). It talks to the
// proxy only through Host (clock, logs, metrics, calls, timers, the
// per-Envoy state) and Stream (one HTTP stream's headers, bodies, resume
// and local reply); a host turns its proxy's callbacks into the Worker's
// hooks:
//
//	w := core.NewWorker(host)         // one per configuration and worker thread
//	w.Configure(pluginJSON)           // the plugin configuration (package config)
//	x := w.Open(stream)               // a stream begins
//	w.RequestHeaders(x)               // decide: Continue, or Pause (resumed or answered later)
//	w.Recover(x, r)                   // a panic the host recovered from RequestHeaders: the failure mode
//	w.RequestBody(x, size, end)       // the request body so far: read for a reserve, or held with its undecided request
//	w.ResponseHeaders(x, end)         // add the rate limit headers, read usage
//	w.ResponseBody(x, size, end)      // a response body chunk
//	w.ResponseTrailers(x)
//	w.End(x)                          // the stream ended: settle its usage
//	w.Close(x)                        // the host forgets the stream
//	w.Answer(callID, &answer)         // a call's answer, in rlsproto.Answer's form
//	w.Tick()                          // when Host.Schedule asked, or about once a second
//	w.Stop()                          // the configuration goes away
//
// # The request path
//
// Read top to bottom, a request goes through these stages (pipeline.go):
//
//  1. descriptors: built from the configuration's actions, one at a time
//     (package descriptors);
//  2. precheck: each descriptor checked as soon as it is built against
//     what the control plane said of it (package precheck); a rejection
//     is a local 429;
//  3. lease pool: admitted with no call when every descriptor's pool (per
//     Envoy, package lease) holds a unit;
//  4. wait: a request whose pool is empty waits for a call under way for
//     the same descriptors (its own worker's, or another's) instead of
//     calling too;
//  5. shared blocks: a block another worker learnt rejects locally (part of
//     the precheck stage, precheck.go);
//  6. call: the control plane is asked (RLS ShouldRateLimit) and the
//     request waits (call.go);
//  7. answer: admitted (the request goes on, with rate limit headers and
//     any quota into the pools), denied (a 429), held (shaping), or failed
//     (the failure mode) (decide.go).
//
// # Hooks and their cost in filter.wasm
//
// A hook whose common case does nothing (End, ResponseHeaders for a local
// reply, Close) checks inline and calls its work, with its deferred
// recover, apart: in filter.wasm every Go call and deferred recover costs
// the guest tens of nanoseconds, more than the check.
//
// Beside it: usage-based limits reserve at the request and settle at the
// end, a charge or a refund (package settle queues them); LLM traffic
// (tokens.go) sizes the reserve from the request body before stage 1 (the
// request waits for its body), reads the usage from the answer and may cut
// a stream whose budget runs out, drawing slices of the key's budget as it
// goes (draw.go; package meter measures a stream, package llm reads the
// wire formats); the lease pools are renewed before they run out (package
// lease); one call table (package calls) routes every answer to its
// handler: a decision, a renewal, a settlement, a draw.
package core
