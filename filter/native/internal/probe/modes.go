package main

import (
	"strconv"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
	"github.com/sluicehq/sluice/filter/native/internal/gostats"
)

// runMode runs the request's mode and returns its status, or false to let
// the request continue.
func (h *stream) runMode(end bool) (dynmod.HeadersStatus, bool) {
	switch h.mode {
	case "headers":
		h.headers()
	case "reply":
		h.s.SendReply(429, []dynmod.Header{
			{Name: "ratelimit-policy", Value: `"user";q=1;w=60`},
			{Name: "retry-after", Value: "60"},
			{Name: "x-probe-request-tid", Value: strconv.Itoa(syscall.Gettid())},
		}, []byte("probe says no\n"), "probe_reply")
		return dynmod.HeadersStop, true
	case "callout":
		return h.callout(h.cfg.cluster, false), true
	case "callout-empty":
		return h.callout("empty", false), true
	case "callout-trailers":
		return h.calloutTo("echo-h2", "/trailers", 5*time.Second, false), true
	case "callout-slow":
		return h.calloutTo(h.cfg.cluster, "/slow", 100*time.Millisecond, false), true
	case "panic-callout":
		return h.callout(h.cfg.cluster, true), true
	case "hop":
		return h.hop(), true
	case "config-callout":
		return h.configCallout(), true
	case "panic-headers":
		panic("probe: injected panic in request_headers")
	case "reply-panic":
		h.s.SendReply(429, nil, []byte("replied, then panicked\n"), "probe_reply_panic")
		panic("probe: injected panic after a local reply")
	case "count":
		h.note("count", h.cfg.count.Add(1))
		h.cfg.worker(h.s.WorkerIndex())
	case "body":
		if !end {
			return dynmod.HeadersStop, true
		}
	case "alloc":
		n, _ := strconv.Atoi(h.mustHeader("x-alloc"))
		garbage(n)
	case "facts":
		h.s.SendReply(200, []dynmod.Header{{Name: "content-type", Value: "application/json"}}, h.cfg.snapshot(), "probe_facts")
		return dynmod.HeadersStop, true
	case "runtime":
		h.s.SendReply(200, []dynmod.Header{{Name: "content-type", Value: "application/json"}}, gostats.Report(&h.cfg.hooks), "probe_runtime")
		return dynmod.HeadersStop, true
	}
	return 0, false
}

// mustHeader returns a request header, or "".
func (h *stream) mustHeader(name string) string {
	v, _ := h.s.Headers(dynmod.RequestHeaders).Get(name)
	return v
}

// headers reads and adds headers, and reads the attributes sluice's
// descriptors use.
func (h *stream) headers() {
	in, ok := h.s.Headers(dynmod.RequestHeaders).Get("x-in")
	h.note("in", strconv.Quote(in)+" "+strconv.FormatBool(ok))
	h.note("in-values", len(h.s.Headers(dynmod.RequestHeaders).Values("x-multi")))
	h.note("header-count", len(h.s.Headers(dynmod.RequestHeaders).All()))
	b, _ := h.s.Headers(dynmod.RequestHeaders).Append(make([]byte, 0, 64), ":path")
	h.note("path-header", string(b))
	h.s.Headers(dynmod.RequestHeaders).Add("x-seen", in)
	h.s.Headers(dynmod.RequestHeaders).Set("x-replaced", "new")
	h.s.Headers(dynmod.RequestHeaders).Remove("x-gone")
	for _, a := range []struct {
		name string
		id   dynmod.Attribute
	}{{"path", dynmod.AttrRequestPath}, {"method", dynmod.AttrRequestMethod}, {"host", dynmod.AttrRequestHost}, {"source", dynmod.AttrSourceAddress}} {
		v, ok := h.s.Attribute(a.id)
		h.note("attr-"+a.name, v+" "+strconv.FormatBool(ok))
	}
	port, ok := h.s.AttributeInt(dynmod.AttrSourcePort)
	h.note("attr-source-port", strconv.FormatUint(port, 10)+" "+strconv.FormatBool(ok))
	h.s.SetMetadataNumber("probe", "cost", 42)
	n, ok := h.s.MetadataNumber(dynmod.DynamicMetadata, "probe", "cost")
	h.note("metadata", strconv.FormatFloat(n, 'f', -1, 64)+" "+strconv.FormatBool(ok))
}

// callout holds the request until the callout's answer, which resumes it
// with the answer's status in a request header (or panics, with crash).
func (h *stream) callout(cluster string, crash bool) dynmod.HeadersStatus {
	return h.calloutTo(cluster, "/callout", 5*time.Second, crash)
}

// calloutTo is callout to a path with a timeout.
func (h *stream) calloutTo(cluster, path string, timeout time.Duration, crash bool) dynmod.HeadersStatus {
	headers := []dynmod.Header{{Name: ":method", Value: "GET"}, {Name: ":path", Value: path}, {Name: "host", Value: cluster}}
	err := h.s.Callout(cluster, headers, nil, timeout, func(r *dynmod.Response) {
		if crash {
			panic("probe: injected panic in http_callout_done")
		}
		body, _ := r.AppendBody(nil, 256)
		h.note("callout-tid", syscall.Gettid())
		if v, ok := r.Header("grpc-status"); ok {
			h.note("callout-grpc-status", v)
		}
		h.note("callout", r.Result.String()+" "+strconv.Itoa(r.Status())+" "+strconv.Quote(string(body)))
		h.s.Headers(dynmod.RequestHeaders).Add("x-callout-status", strconv.Itoa(r.Status()))
		h.resume()
	})
	if err != nil {
		h.note("callout-error", err)
		return dynmod.HeadersContinue
	}
	return h.hold()
}

// hop holds the request and resumes it from a goroutine through the
// stream's scheduler.
func (h *stream) hop() dynmod.HeadersStatus {
	sched := h.s.Scheduler()
	go func() {
		gtid := syscall.Gettid()
		sched.Post(func() {
			h.note("goroutine-tid", gtid)
			h.note("hop-tid", syscall.Gettid())
			h.resume()
		})
	}()
	return h.hold()
}

// configCallout holds the request, makes a configuration-level callout on
// the main thread, and resumes the request from the answer through the
// stream's scheduler.
func (h *stream) configCallout() dynmod.HeadersStatus {
	sched := h.s.Scheduler()
	c := h.cfg.c
	headers := h.calloutHeaders()
	posted := c.Post(func() {
		mainTID := syscall.Gettid()
		err := c.Callout(h.cfg.cluster, headers, nil, 5*time.Second, func(r *dynmod.Response) {
			doneTID, status := syscall.Gettid(), r.Status()
			sched.Post(func() {
				h.note("config-post-tid", mainTID)
				h.note("config-callout-tid", doneTID)
				h.note("config-callout", status)
				h.resume()
			})
		})
		if err != nil {
			sched.Post(func() {
				h.note("config-callout-error", err)
				h.resume()
			})
		}
	})
	if !posted {
		h.note("config-callout-error", "not posted")
		return dynmod.HeadersContinue
	}
	return h.hold()
}
