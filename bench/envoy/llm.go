package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/e2e/stack"
)

// The LLM row: what reading LLM traffic costs Envoy per request, against
// setup 7 and against the same traffic with a filter that does not read it:
//
//	7p4, L4    a 4 KiB chat completions request body: passed on unread (7p4), or read for the reserve (L4)
//	7p64, L64  the same with a 64 KiB body
//	7s, Ls     a 200-chunk SSE answer: passed on unread (7s), or its usage read and its output counted (Ls)
//
// The JSON answers come from the backend listener (direct_response, with a
// usage object); the SSE answers from a Go server of this process (its CPU
// is not Envoy's) that writes and flushes each event.

// llmSetups are the LLM row's setups.
var llmSetups = []setup{
	{id: "7p4", name: "setup 7, a 4 KiB chat request body passed on unread, a JSON answer with usage", rls: rlsSluice, load: loadSpread,
		body: 4 << 10, filter: sluiceFilter, adds: "ratelimit"},
	{id: "L4", name: "sluice filter, reserve read from a 4 KiB chat request body, usage from the JSON answer", rls: rlsSluice, load: loadSpread,
		body: 4 << 10, filter: func(b *built) []stack.M { return llmFilter(b, true) }, adds: "ratelimit"},
	{id: "7p64", name: "setup 7, a 64 KiB chat request body passed on unread, a JSON answer with usage", rls: rlsSluice, load: loadSpread,
		body: 64 << 10, filter: sluiceFilter, adds: "ratelimit"},
	{id: "L64", name: "sluice filter, reserve read from a 64 KiB chat request body, usage from the JSON answer", rls: rlsSluice, load: loadSpread,
		body: 64 << 10, filter: func(b *built) []stack.M { return llmFilter(b, true) }, adds: "ratelimit"},
	{id: "7s", name: "setup 7, a 200-chunk SSE answer passed on unread", rls: rlsSluice, load: loadSpread,
		sse: true, filter: sluiceFilter, adds: "ratelimit"},
	{id: "Ls", name: "sluice filter, usage read and output counted from a 200-chunk SSE answer", rls: rlsSluice, load: loadSpread,
		sse: true, filter: func(b *built) []stack.M { return llmFilter(b, false) }, adds: "ratelimit"},
}

func init() {
	for _, s := range llmSetups {
		setups[s.id] = s
	}
}

// llmFilter is sluiceFilter's rate limit with its usage an LLM's tokens:
// the reserve from the request body (fromBody; else a reserve of 1000),
// the usage from the answer, refunds settled in batches.
func llmFilter(b *built, fromBody bool) []stack.M {
	usage := map[string]any{"reserve": 1000, "source": map[string]any{"llm_usage": map[string]any{}}}
	if fromBody {
		usage["reserve_from_request"] = true
	}
	plugin := map[string]any{
		"cluster": rlsCluster, "domain": domain, "timeout": "100ms", "failure_mode": "open",
		"rate_limits": []any{map[string]any{
			"actions": []any{map[string]any{"request_headers": map[string]any{"header_name": userHeader, "descriptor_key": "user"}}},
			"usage":   usage,
		}},
		"precheck": map[string]any{"enabled": true, "max_entries": 20000},
		"headers":  map[string]any{"draft10": true, "legacy": false, "retry_after": true},
		"llm":      map[string]any{"max_request_bytes": 128 << 10},
	}
	js, _ := json.Marshal(plugin)
	f := wasmFilter(b.filterWasm, js)
	// Envoy's proxy-wasm host passes a waiting request's body to the
	// filter only with this.
	f["typed_config"].(stack.M)["config"].(stack.M)["allow_on_headers_stop_iteration"] = true
	return []stack.M{f}
}

// llmAnswerJSON is the backend's JSON answer of the LLM setups.
const llmAnswerJSON = `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,` +
	`"message":{"role":"assistant","content":"Short answer."},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":310,"completion_tokens":42,"total_tokens":352}}`

// writeLLMBody writes a chat completions request body of about n bytes
// into dir and returns its path.
func writeLLMBody(dir string, n int) (string, error) {
	head := `{"model":"gpt-4o","max_tokens":512,"stream":false,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"`
	tail := `"}]}`
	text := strings.Repeat("Lorem ipsum dolor sit amet, consectetur adipiscing elit. ", n/57+1)
	body := head + text[:max(0, n-len(head)-len(tail))] + tail
	path := filepath.Join(dir, "llm-body-"+strconv.Itoa(n)+".json")
	return path, os.WriteFile(path, []byte(body), 0o644)
}

// sseEvents is the number of events of the SSE backend's answer.
const sseEvents = 200

// startSSEBackend serves, on a free port, a chat completions stream of
// sseEvents events (each written and flushed alone), the last with the
// usage, then [DONE]; it returns the address.
func startSSEBackend() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	var events []byte
	for i := range sseEvents - 1 {
		events = fmt.Appendf(events, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"}}]}\n\n", i)
	}
	events = append(events, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":310,\"completion_tokens\":400,\"total_tokens\":710}}\n\ndata: [DONE]\n\n"...)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		bw := bufio.NewWriterSize(w, 512)
		for p := events; len(p) > 0; {
			i := strings.Index(string(p), "\n\n") + 2
			bw.Write(p[:i])
			bw.Flush()
			if rc.Flush() != nil {
				return
			}
			p = p[i:]
		}
	})}
	go srv.Serve(ln)
	return ln.Addr().String(), nil
}

// summarizeLLM prints what reading LLM traffic adds to Envoy's CPU per
// request (the goal: at most 25% over setup 7).
func summarizeLLM(get func(string) (result, bool)) {
	seven, ok7 := get("7/spread")
	for _, p := range [][2]string{{"7p4", "L4"}, {"7p64", "L64"}, {"7s", "Ls"}} {
		base, ok1 := get(p[0] + "/spread")
		llm, ok2 := get(p[1] + "/spread")
		if !ok1 || !ok2 {
			continue
		}
		fmt.Printf("LLM %s vs %s: Envoy CPU per request %.2f vs %.2f us = %+.1f%% (goal <= +25%%)",
			p[1], p[0], llm.envoyUS, base.envoyUS, 100*(llm.envoyUS/base.envoyUS-1))
		if ok7 {
			fmt.Printf("; %.2fx setup 7's %.2f us (a GET, a tiny answer)", llm.envoyUS/seven.envoyUS, seven.envoyUS)
		}
		fmt.Println()
	}
}
