// Package celcost measures what an expression language would cost the
// filter: the weighted cost input*a + output*b + cached*c evaluated with
// cel-go (cel.dev/cel-go) against the plain integer arithmetic of
// filter/core/llm's Weights.Cost, per evaluation and in a Wasm module's size.
// It is a separate module so that cel-go never becomes a dependency of
// sluice itself.
//
//	cd bench/celcost && go test -run '^$' -bench . -benchmem -count 5
//	cd bench/celcost && GOOS=wasip1 GOARCH=wasm go test -run '^$' -bench . -count 5 \
//	    -exec="$PWD/../../bin/wazero run -mount=/:/ -env-inherit -cachedir=$PWD/../../.cache/wazero"
//	cd bench/celcost && ./sizes.sh
//
// The figures and the choice they led to are in filter/core/llm/RATIONALE.md.
package celcost
