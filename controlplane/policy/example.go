package policy

import _ "embed"

//go:embed example.yaml
var exampleYAML []byte

// ExampleSource names the embedded example policy in errors and listings.
const ExampleSource = "embedded:example.yaml"

// Example returns the example policies (domain "sluice-demo") that the
// control plane serves when it is given no policy file: the policies of
// `make run`.
func Example() *Set {
	d, err := Parse(ExampleSource, exampleYAML)
	if err != nil {
		panic("policy: the embedded example is invalid: " + err.Error()) // caught by TestExampleEmbedded
	}
	s, _ := NewSet(d)
	return s
}
