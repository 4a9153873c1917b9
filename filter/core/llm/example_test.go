package llm_test

import (
	"fmt"

	"github.com/sluicehq/sluice/filter/core/llm"
)

func ExampleReadRequest() {
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,
		"system":"Be brief.","messages":[{"role":"user","content":"How cold is Oslo in January?"}]}`)
	q := llm.ReadRequest(body, 64<<10)
	fmt.Println(q.Status, q.Model, q.MaxOutput, q.Stream)
	fmt.Println("prompt bytes:", q.PromptBytes, "tokens:", q.PromptTokens(llm.DefaultRatio))
	fmt.Println("reserve:", q.Reserve(llm.DefaultRatio, 4096))
	// Output:
	// ok claude-sonnet-4-5 1024 true
	// prompt bytes: 37 tokens: 10
	// reserve: 1034
}

func ExampleRequestReader() {
	// The filter feeds the body as Envoy delivers it; past the maximum the
	// reader stops reading and the caller charges its default reserve.
	r := llm.NewRequestReader(32)
	r.Write([]byte(`{"model":"gpt-5","input":"a question that `))
	r.Write([]byte(`goes on and on"}`))
	fmt.Println(r.Result().Status)
	// Output:
	// too_large
}

func ExampleSSEReader() {
	r := llm.NewSSEReader(llm.StreamOptions{Ratio: llm.DefaultRatio})
	chunks := []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"Danube, Rh",
		"ine, Loire.\"}}],\"usage\":null}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":31,\"completion_tokens\":7,",
		"\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n",
	}
	for _, c := range chunks {
		r.Write([]byte(c))
		fmt.Println("output so far:", r.OutputTokens())
	}
	res := r.Result()
	fmt.Printf("%s %+v\n", res.Status, res.Usage)
	// Output:
	// output so far: 0
	// output so far: 6
	// output so far: 6
	// output so far: 7
	// complete {Input:15 Cached:16 CacheWrite:0 Output:7}
}

func ExampleJSONReader() {
	r := llm.NewJSONReader()
	r.Write([]byte(`{"id":"msg_01","content":[{"type":"text","text":"Cold."}],`))
	r.Write([]byte(`"usage":{"input_tokens":12,"cache_read_input_tokens":1800,"output_tokens":9}}`))
	res := r.Result()
	fmt.Printf("%s %+v total %d\n", res.Status, res.Usage, res.Usage.Total())
	// Output:
	// complete {Input:12 Cached:1800 CacheWrite:0 Output:9} total 1821
}

func ExampleAppendCutEvent() {
	fmt.Printf("%s", llm.AppendCutEvent(nil, llm.Anthropic, "token budget spent", 0))
	// Output:
	// event: error
	// data: {"type":"error","error":{"type":"rate_limit_error","message":"token budget spent"}}
}

func ExampleTable_Cost() {
	// A budget in micro-dollars; weights in micro-dollars per million tokens.
	table, err := llm.NewTable([]llm.Row{
		{Model: "gpt-4o*", Input: 2_500_000, Output: 10_000_000, Cached: 1_250_000},
		{Model: "claude-sonnet-4-5*", Input: 3_000_000, Output: 15_000_000, Cached: 300_000, CacheWrite: 3_750_000, HasCacheWrite: true},
		{Model: "*", Input: 5_000_000, Output: 20_000_000, Cached: 5_000_000},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	u := llm.Usage{Input: 12, Cached: 1800, CacheWrite: 200, Output: 900}
	fmt.Println(table.Cost("claude-sonnet-4-5-20250929", u), "micro-dollars")
	_, err = llm.NewTable([]llm.Row{{Model: "*"}, {Model: "gpt-4o", Output: -1}})
	fmt.Println(err)
	// Output:
	// 14826 micro-dollars
	// weights[1].output: must be between 0 and 1000000000000 (units per million tokens), not -1
}
