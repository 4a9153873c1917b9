package redistest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clusterSlots is the number of hash slots in a Redis Cluster.
const clusterSlots = 16384

// clusterTimeout bounds how long a cluster may take to report cluster_state:ok on every node.
const clusterTimeout = 20 * time.Second

// Cluster is a Redis Cluster of masters without replicas, started for a test.
type Cluster struct {
	t     testing.TB
	nodes []*Server // the masters; node i owns the i-th equal share of the slots
}

// StartCluster starts a Redis Cluster of the given number of masters (no replicas) on reserved
// 127.0.0.1 ports (client and cluster bus), splits the 16384 slots evenly between them and returns
// once every node reports cluster_state:ok. Each node has its own directory and nodes.conf. Every
// node is stopped when the test and its subtests end.
func StartCluster(t testing.TB, masters int, opts ...Option) *Cluster {
	t.Helper()
	if masters < 1 || masters > clusterSlots {
		t.Fatalf("redistest: StartCluster: masters = %d, want 1 to %d", masters, clusterSlots)
	}
	c := &Cluster{t: t}
	for range masters {
		s, err := newServer(t, true, opts)
		if err != nil {
			t.Fatalf("redistest: StartCluster: %v", err)
		}
		c.nodes = append(c.nodes, s)
	}
	// Give each node a distinct config epoch and its slots before they meet, the way
	// `redis-cli --cluster create` does. Then introduce every pair of nodes directly: with
	// introductions through one node only, a node can briefly count itself in a minority while
	// gossip spreads, and Redis then holds its state at fail for up to 5 s more.
	for i, s := range c.nodes {
		lo, hi := i*clusterSlots/masters, (i+1)*clusterSlots/masters-1
		for _, cmd := range [][]string{
			{"CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i + 1)},
			{"CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)},
		} {
			if _, err := s.command(time.Second, cmd...); err != nil {
				t.Fatalf("redistest: StartCluster: %s on %s: %v", strings.Join(cmd, " "), s.Addr(), err)
			}
		}
	}
	for i, from := range c.nodes {
		for _, s := range c.nodes[i+1:] {
			s.mu.Lock()
			port, bus := s.port, s.busPort
			s.mu.Unlock()
			if _, err := from.command(time.Second, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(port), strconv.Itoa(bus)); err != nil {
				t.Fatalf("redistest: StartCluster: CLUSTER MEET %s from %s: %v", s.Addr(), from.Addr(), err)
			}
		}
	}
	c.WaitOK()
	return c
}

// Addrs returns the addresses of the masters, "127.0.0.1:port" each.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.Addr()
	}
	return out
}

// Nodes returns the masters, for fault tests (Kill, Restart). Node i owns slots
// i*16384/n to (i+1)*16384/n-1.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// WaitOK waits until every node reports cluster_state:ok, knows every other node and sees all
// 16384 slots served, for example after Restart of a node. It fails the test after a deadline.
// Call it from the test's goroutine.
func (c *Cluster) WaitOK() {
	c.t.Helper()
	deadline := time.Now().Add(clusterTimeout)
	for {
		var problem string
		for _, s := range c.nodes {
			if problem = clusterProblem(s, len(c.nodes)); problem != "" {
				break
			}
		}
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redistest: cluster not ready after %v: %s", clusterTimeout, problem)
		}
		time.Sleep(pollInterval) // polling a real process until it converges
	}
}

// clusterProblem returns why node s does not yet see a healthy cluster of n nodes, or "" if it does.
func clusterProblem(s *Server, n int) string {
	addr := s.Addr()
	info, err := s.command(time.Second, "CLUSTER", "INFO")
	if err != nil {
		return fmt.Sprintf("%s: CLUSTER INFO: %v", addr, err)
	}
	fields := parseInfo(info)
	want := map[string]string{
		"cluster_state":       "ok",
		"cluster_slots_ok":    strconv.Itoa(clusterSlots),
		"cluster_known_nodes": strconv.Itoa(n),
	}
	for _, k := range []string{"cluster_state", "cluster_slots_ok", "cluster_known_nodes"} {
		if fields[k] != want[k] {
			return fmt.Sprintf("%s: %s is %q, want %q", addr, k, fields[k], want[k])
		}
	}
	return ""
}

// parseInfo parses the "key:value" lines of an INFO-style reply.
func parseInfo(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimRight(line, "\r"), ":"); ok {
			m[k] = v
		}
	}
	return m
}
