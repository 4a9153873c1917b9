package stack

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sample is one line of the Prometheus text format: a metric name, its
// labels and its value.
type Sample struct {
	Name   string            // metric name, e.g. sluice_rls_decisions_total
	Labels map[string]string // label name -> value
	Value  float64           // sample value
}

// Samples is a scrape of a /metrics endpoint.
type Samples []Sample

// Sum adds the values of the samples named name whose labels include every
// name=value pair of match (given as alternating names and values).
func (s Samples) Sum(name string, match ...string) float64 {
	var total float64
next:
	for _, x := range s {
		if x.Name != name {
			continue
		}
		for i := 0; i+1 < len(match); i += 2 {
			if x.Labels[match[i]] != match[i+1] {
				continue next
			}
		}
		total += x.Value
	}
	return total
}

// Scrape fetches url and parses the Prometheus text format.
func Scrape(url string) (Samples, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: status %d", url, resp.StatusCode)
	}
	s, err := ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return s, nil
}

// ParseMetrics parses the Prometheus text exposition format. Comments and
// timestamps are skipped.
func ParseMetrics(r io.Reader) (Samples, error) {
	var out Samples
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseSample parses `name{a="x",b="y"} value [timestamp]`.
func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	s.Name, line = line[:i], line[i:]
	if line[0] == '{' {
		line = line[1:]
		for {
			line = strings.TrimLeft(line, " ,")
			if strings.HasPrefix(line, "}") {
				line = line[1:]
				break
			}
			eq := strings.IndexByte(line, '=')
			if eq <= 0 || eq+1 >= len(line) || line[eq+1] != '"' {
				return s, fmt.Errorf("bad label in %q", line)
			}
			key := strings.TrimSpace(line[:eq])
			line = line[eq+2:]
			var val strings.Builder
			j := 0
			for ; j < len(line) && line[j] != '"'; j++ {
				if line[j] == '\\' && j+1 < len(line) {
					j++
					switch line[j] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(line[j])
					}
					continue
				}
				val.WriteByte(line[j])
			}
			if j == len(line) {
				return s, fmt.Errorf("unterminated label value for %s", key)
			}
			s.Labels[key] = val.String()
			line = line[j+1:]
		}
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value for %s", s.Name)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("value of %s: %w", s.Name, err)
	}
	s.Value = v
	return s, nil
}
