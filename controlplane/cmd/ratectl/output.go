package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// print writes v in the output format: text calls text; yaml and json
// encode v.
func (e *env) print(v any, text func(io.Writer)) error {
	switch e.g.output {
	case "json":
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		return writeYAML(e.stdout, v)
	}
	var buf bytes.Buffer
	text(&buf)
	_, err := e.stdout.Write(buf.Bytes())
	return err
}

// printStreamed writes message n of a stream: JSON one object per line,
// YAML one document each, text as text.
func (e *env) printStreamed(n int, v any, text func(io.Writer)) error {
	switch e.g.output {
	case "json":
		return json.NewEncoder(e.stdout).Encode(v)
	case "yaml":
		if n > 0 {
			if _, err := io.WriteString(e.stdout, "---\n"); err != nil {
				return err
			}
		}
		return writeYAML(e.stdout, v)
	}
	return e.print(v, text)
}

// writeYAML encodes v as one YAML document.
func writeYAML(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode the output as YAML: %v", err)
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}
