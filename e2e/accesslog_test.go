package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// logEntry is one line of a listener's access log (accessLogFormat).
type logEntry struct {
	vm      string // the worker the test's connection was on, "-" if none
	key     string // the api key
	status  int
	details string // Envoy's response code details
}

// parseAccessLog parses access log lines; it skips what it cannot read.
func parseAccessLog(text string) []logEntry {
	var out []logEntry
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		if len(f) != 4 {
			continue
		}
		status, err := strconv.Atoi(f[2])
		if err != nil {
			continue
		}
		out = append(out, logEntry{vm: f[0], key: f[1], status: status, details: f[3]})
	}
	return out
}

// accessLogs waits until the Envoys' access logs hold want entries for key
// in all, and returns them per Envoy. Envoy writes access logs out every
// 10 s, or when its admin interface is asked to reopen them.
func (c *cluster) accessLogs(key string, want int) ([][]logEntry, error) {
	deadline := time.Now().Add(10 * time.Second)
	client := &http.Client{Timeout: 5 * time.Second}
	for {
		per := make([][]logEntry, len(c.logs))
		total := 0
		for i, path := range c.logs {
			resp, err := client.Post(c.envoys[i].AdminURL()+"/reopen_logs", "", nil)
			if err != nil {
				return nil, fmt.Errorf("envoy %d: %w", i, err)
			}
			resp.Body.Close()
			b, _ := os.ReadFile(path)
			for _, e := range parseAccessLog(string(b)) {
				if e.key == key {
					per[i] = append(per[i], e)
				}
			}
			total += len(per[i])
		}
		if total == want {
			return per, nil
		}
		if total > want || time.Now().After(deadline) {
			return per, fmt.Errorf("the access logs hold %d entries for %s, want %d", total, key, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
