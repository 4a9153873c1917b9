package llm

import "github.com/sluicehq/sluice/filter/core/llm/internal/jsonscan"

// One schema reads every answer this package knows, JSON body or SSE
// event, without being told the provider: the names it looks for do not
// clash between the three formats (see doc.go).

// Slots of the answer schema.
const (
	slotFinal   = 0        // rawCount slots: a top-level usage, response.usage
	slotPartial = rawCount // rawCount slots: message.usage (Anthropic's message_start)
	slotSeq     = 2 * rawCount

	ctrChat      = 0 // choices[].delta text
	ctrAnthropic = 1 // delta.text, delta.partial_json, delta.thinking
	ctrResponses = 2 // a top-level delta string (its type decides)

	capType   = 0 // the top-level type
	capTypeSz = 48

	flagError = 0 // a top-level error member
)

// finalMask selects the slots of a final usage.
const finalMask = 1<<rawCount - 1

var answerSchema = newAnswerSchema()

func newAnswerSchema() *jsonscan.Schema {
	s := jsonscan.NewSchema()
	s.Capture(capType, capTypeSz)
	root := s.New()
	chat := s.Add(jsonscan.Def{Measure: at(ctrChat)})
	function := s.Add(object(member("arguments", chat)))
	toolCall := s.Add(object(member("function", function)))
	chatDelta := s.Add(object(append(members(chat, "content", "refusal", "reasoning_content", "reasoning"),
		member("tool_calls", s.Add(arrayOf(toolCall))))...))
	choices := s.Add(arrayOf(s.Add(object(member("delta", chatDelta)))))
	// Anthropic's delta is an object, the Responses API's a string.
	delta := object(members(s.Add(jsonscan.Def{Measure: at(ctrAnthropic)}), "text", "partial_json", "thinking")...)
	delta.Measure = at(ctrResponses)
	s.Set(root, object(
		member("usage", usageNode(s, slotFinal)),
		member("response", s.Add(object(member("usage", usageNode(s, slotFinal))))),
		member("message", s.Add(object(member("usage", usageNode(s, slotPartial))))),
		member("type", s.Add(jsonscan.Def{Capture: at(capType)})),
		member("delta", s.Add(delta)),
		member("choices", choices),
		member("sequence_number", s.Add(jsonscan.Def{Int: at(slotSeq)})),
		member("error", s.Add(jsonscan.Def{Flag: at(flagError)})),
	))
	return s
}

// usageNode is a usage object of any of the three formats, read into the
// rawCount slots from base.
func usageNode(s *jsonscan.Schema, base int) jsonscan.Node {
	details := s.Add(object(member("cached_tokens", s.Add(jsonscan.Def{Int: at(base + rawCachedPart)}))))
	m := append(members(s.Add(jsonscan.Def{Int: at(base + rawInput)}), "prompt_tokens", "input_tokens"),
		members(s.Add(jsonscan.Def{Int: at(base + rawOutput)}), "completion_tokens", "output_tokens")...)
	m = append(m, members(details, "prompt_tokens_details", "input_tokens_details")...)
	m = append(m, member("cache_read_input_tokens", s.Add(jsonscan.Def{Int: at(base + rawCacheRead)})),
		member("cache_creation_input_tokens", s.Add(jsonscan.Def{Int: at(base + rawCacheWrite)})))
	return s.Add(object(m...))
}

// answerState is what an answer's documents (SSE events, or one JSON
// body) add up to.
type answerState struct {
	acc    usageAcc
	stats  Stats
	ratio  Ratio
	seq    int64 // the last sequence_number (the Responses API's)
	hasSeq bool
	// The running count of output tokens: the provider's last count, plus
	// the estimate of the text that came after it; never decreasing.
	provider int64
	since    int64
	out      int64
}

// commit adds a complete document's values.
func (a *answerState) commit(sc *jsonscan.Scanner) {
	if sc.Values().IntsSeen(1<<(2*rawCount) - 1) {
		a.usage(sc)
	}
	typ, _ := sc.Captured(capType)
	text := sc.Values().Counter(ctrChat) + sc.Values().Counter(ctrAnthropic)
	if responsesTextDelta(typ) {
		text += sc.Values().Counter(ctrResponses)
	}
	if text > 0 {
		a.addText(text)
	}
	if v, set, _ := sc.Values().Int(slotFinal + rawOutput); set {
		a.providerCount(v)
	} else if v, set, _ := sc.Values().Int(slotPartial + rawOutput); set {
		a.providerCount(v)
	}
	if v, set, _ := sc.Values().Int(slotSeq); set {
		a.seq, a.hasSeq = v, true
	}
	if sc.Values().Flag(flagError) || string(typ) == "error" || string(typ) == "response.failed" {
		a.stats.Errors++
	}
}

// usage takes a document's usage counts.
func (a *answerState) usage(sc *jsonscan.Scanner) {
	for k := 0; k < rawCount; k++ {
		for _, slot := range [2]int{slotPartial + k, slotFinal + k} {
			v, set, bad := sc.Values().Int(slot)
			a.acc.malformed = a.acc.malformed || bad
			if set {
				a.acc.v[k] = v
				a.acc.seen |= 1 << k
			}
		}
	}
	if sc.Values().IntsSeen(finalMask) {
		a.acc.final = true
	}
}

// responsesTextDelta reports whether a Responses API event of type typ
// carries generated text in its delta: response.output_text.delta,
// response.function_call_arguments.delta, response.reasoning_text.delta
// and the others of the family; response.audio.delta carries audio
// (base64), which is not counted by its bytes.
func responsesTextDelta(typ []byte) bool {
	const prefix, suffix = "response.", ".delta"
	n := len(typ)
	return n > len(prefix)+len(suffix) && string(typ[:len(prefix)]) == prefix &&
		string(typ[n-len(suffix):]) == suffix && string(typ) != "response.audio.delta"
}

// addText counts n bytes of generated text in the running output count.
func (a *answerState) addText(n int64) {
	a.since = addSat(a.since, n)
	a.raise(addSat(a.provider, a.ratio.Tokens(a.since)))
}

// providerCount takes the provider's own count of output tokens so far.
func (a *answerState) providerCount(v int64) {
	a.provider, a.since = v, 0
	a.raise(v)
}

// raise keeps the running count monotonic: what it said has been drawn.
func (a *answerState) raise(v int64) {
	if v > a.out {
		a.out = v
	}
}

// result is the Result of the documents committed.
func (a *answerState) result() Result {
	u, st := a.acc.result()
	return Result{Usage: u, Status: st, Stats: a.stats}
}
