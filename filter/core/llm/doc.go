// Package llm reads what a rate limiter needs from LLM API traffic, without
// a host: the reserve a request asks for, the usage an answer reports, the
// output tokens of a stream as it flows, the event that ends a stream cut
// for its budget, and the weighted cost of a usage. It knows three wire
// formats: OpenAI's chat completions, OpenAI's Responses API and
// Anthropic's messages. It depends on the standard library only, runs
// natively and as wasip1, and allocates nothing once its readers exist.
//
// # The request
//
// RequestReader (or ReadRequest for a whole body) takes a request body in
// pieces, up to a maximum the caller sets; past it the body is not read
// (RequestTooLarge: the caller charges its default reserve and counts it).
// A body that is not one JSON object is RequestMalformed. From a body it
// takes:
//
//   - model;
//   - the maximum output: the largest of max_tokens (chat, Anthropic),
//     max_completion_tokens (chat) and max_output_tokens (Responses), and
//     whether any was given; chat's n multiplies it;
//   - the prompt's text bytes: message contents as strings or as the text
//     of content parts and blocks (nested tool results included), system
//     (string or blocks), instructions, input (string or items), tool call
//     arguments and tool outputs; tool definitions and Anthropic tool_use
//     inputs count as their JSON. Images, audio and files are not counted:
//     their tokens do not follow their bytes (a base64 image would be
//     counted a hundred times over);
//   - stream and stream_options.include_usage.
//
// A Ratio (bytes per token, in thousandths) turns the text into a prompt
// estimate; the reserve is the estimate plus the maximum output. A body of
// another shape (a legacy completions prompt, an embeddings input) is
// RequestOK with nothing found: no model (the weight table's default row),
// no maximum (the caller's default) and no prompt text. Members are
// looked for at the top level only: a "model" inside metadata is not the
// model.
//
// # The answer
//
// JSONReader reads an answer that is not streamed, SSEReader a streamed
// one (text/event-stream), both fed chunk by chunk with chunk boundaries
// anywhere. One reader serves the three formats without being told which:
// their names do not clash. A usage object is read at the top level
// (OpenAI chat, an Anthropic message or message_delta), in response (the
// Responses API's response.completed, .incomplete and .failed events) and
// in message (Anthropic's message_start, whose counts are not final). Its
// counts are split the way providers bill them (see Usage): OpenAI's
// cached_tokens are a part of its input count, Anthropic's
// cache_read_input_tokens are apart from input_tokens and its cache writes
// are a third part. In a stream each count is the last value seen, so
// Anthropic's message_start gives the input and its message_delta the
// cumulative output. The Result says whether the usage is complete,
// partial (a stream cut before its end), missing (OpenAI chat without
// include_usage) or malformed (a count that is not a whole number in
// [0, 2^53-1]); the caller maps the last three to its configured missing
// outcome. Events that are not JSON are counted, and skipped.
//
// # Counting a stream as it flows
//
// SSEReader.OutputTokens is, after each chunk, the output tokens of the
// events complete so far: the provider's own count where one has come
// (Anthropic's message_delta, a final usage), plus the text that came
// after it, estimated with the Ratio: chat's choices[].delta content,
// refusal, reasoning and tool call arguments; the Responses API's *.delta
// events of text (not response.audio.delta); Anthropic's
// content_block_delta text, partial_json and thinking. The count never
// decreases (what it said has been drawn from a budget). A filter that
// cuts a stream sends AppendCutEvent's event, in the provider's error
// shape, then ends the stream; SSEReader.Pending says how many bytes of an
// unfinished event to hold back so that the client does not get half an
// event first, and NextSequence numbers a Responses API event.
//
// # Bounds
//
// Nothing of a body is kept. A reader's memory is its struct: about 1 KiB
// for RequestReader and JSONReader, 2.6 KiB for SSEReader (half of it a
// memo, below), whatever the body's size (TestReaderSizes holds them). Within it: nesting up to 64
// levels (deeper is malformed), keys compared up to 32 bytes, the model
// name kept up to MaxModelBytes, an event's type up to 48. An SSE event is
// read up to MaxEventBytes (4 MiB by default, a million tokens: the
// Responses API's response.completed repeats the whole answer); past it the
// event is skipped and counted (Stats.Oversized) and its bytes count as
// output text, so that a cut stream cannot run on in one huge event.
// Counts, sums and products saturate at MaxTokens.
//
// # How it reads JSON
//
// A small resumable scanner (internal/jsonscan) checks the grammar of the
// whole document and keeps only what a schema names: whole numbers into
// slots, booleans, the first bytes of a few strings, the lengths of
// others. The schemas of this package are tables built once (schema.go,
// answer.go, request.go). encoding/json would keep the body and cost
// reflection; in Wasm its size and its per-value cost are both large.
//
// Go compiled to Wasm pays for each branch and each call about what it
// pays for a byte of work (measured under wazero: about 100 instructions
// a trip around a byte loop, 250 a call), so the scanner takes a token at
// a time where it can: keys and strings found eight bytes at a time,
// whole integers and literals at once, keys looked up by a hash; only a
// token cut by the end of a piece, or with escapes, goes byte by byte.
// And the events of a stream repeat a long prefix (each OpenAI chunk
// repeats its id, model and fingerprint before the delta): a Memo keeps the
// last event's first 512 bytes and the scanner's state at the point where
// the last two events parted, and an event that shares those bytes is
// compared, not scanned, up to there. Results are the same with it or
// without (tested on every input the fuzz targets make).
//
// # Weighted cost
//
// A Table gives each model its Weights, in budget units per million
// tokens (WeightScale), so that a budget can be micro-dollars as providers
// quote prices, or tokens (every weight 1000000). The cost of a usage is
// the exact weighted sum divided by a million, rounded up, saturating.
// RATIONALE.md says why there is no expression language, and why model
// names match exactly or by prefix.
package llm
