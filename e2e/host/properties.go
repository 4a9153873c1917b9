package host

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"
)

// property looks up an Envoy attribute for proxy_get_property. path is the
// attribute's segments separated by NUL bytes ("source\x00address"). Values
// are serialized as Envoy serializes CEL values: strings as their bytes,
// integers as 8 little-endian bytes, booleans as one byte, maps in the
// proxy-wasm pairs format. Values set with proxy_set_property are returned
// as stored. vm.mu is held.
func (vm *VM) property(path string) ([]byte, Status) {
	st := vm.target()
	if st != nil {
		if v, ok := st.props[path]; ok {
			return v, StatusOK
		}
	}
	parts := strings.Split(strings.TrimSuffix(path, "\x00"), "\x00")
	cfg := vm.host.cfg
	switch parts[0] {
	case "plugin_name":
		return leaf(parts, []byte(cfg.PluginName))
	case "plugin_root_id":
		return leaf(parts, []byte(cfg.RootID))
	case "plugin_vm_id":
		return leaf(parts, []byte(cfg.VMID))
	}
	if st == nil || len(parts) < 2 {
		return nil, StatusNotFound
	}
	switch parts[0] {
	case "source":
		return peerProperty(parts[1:], st.info.RemoteAddr)
	case "destination":
		return peerProperty(parts[1:], st.info.LocalAddr)
	case "upstream":
		if st.upstreamAddr == "" {
			return nil, StatusNotFound
		}
		return peerProperty(parts[1:], st.upstreamAddr)
	case "connection":
		switch parts[1] {
		case "mtls":
			return leaf(parts[1:], []byte{0})
		case "id":
			return leaf(parts[1:], int64Bytes(int64(st.info.ConnectionID)))
		}
	case "request":
		return requestProperty(parts[1:], st)
	case "response":
		return responseProperty(parts[1:], st)
	}
	return nil, StatusNotFound
}

// leaf returns v when parts has no further segment (a scalar has no fields).
func leaf(parts []string, v []byte) ([]byte, Status) {
	if len(parts) != 1 {
		return nil, StatusNotFound
	}
	return v, StatusOK
}

// int64Bytes serializes an integer attribute.
func int64Bytes(v int64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(v))
	return b
}

// peerProperty serves source.*, destination.* and upstream.*: address is the
// "ip:port" string, port the port as an integer.
func peerProperty(parts []string, addr string) ([]byte, Status) {
	if addr == "" {
		return nil, StatusNotFound
	}
	switch parts[0] {
	case "address":
		return leaf(parts, []byte(addr))
	case "port":
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, StatusNotFound
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, StatusNotFound
		}
		return leaf(parts, int64Bytes(n))
	}
	return nil, StatusNotFound
}

// requestProperty serves request.* from the request headers as the filter
// left them.
func requestProperty(parts []string, st *Stream) ([]byte, Status) {
	h := st.req
	header := func(k string) ([]byte, Status) {
		v, ok := h.Get(k)
		if !ok {
			return nil, StatusNotFound
		}
		return leaf(parts, []byte(v))
	}
	switch parts[0] {
	case "path":
		return header(":path")
	case "url_path", "query":
		p, ok := h.Get(":path")
		if !ok {
			return nil, StatusNotFound
		}
		path, query, _ := strings.Cut(p, "?")
		if parts[0] == "query" {
			return leaf(parts, []byte(query))
		}
		return leaf(parts, []byte(path))
	case "host":
		return header(":authority")
	case "scheme":
		return header(":scheme")
	case "method":
		return header(":method")
	case "referer":
		return header("referer")
	case "useragent":
		return header("user-agent")
	case "id":
		return header("x-request-id")
	case "protocol":
		return leaf(parts, []byte(st.info.Protocol))
	case "time":
		return leaf(parts, int64Bytes(st.info.Start.UnixNano()))
	case "headers":
		return headersProperty(parts, h)
	}
	return nil, StatusNotFound
}

// responseProperty serves response.* once the response headers are known.
func responseProperty(parts []string, st *Stream) ([]byte, Status) {
	if len(st.resp) == 0 {
		return nil, StatusNotFound
	}
	switch parts[0] {
	case "code":
		s, ok := st.resp.Get(":status")
		if !ok {
			return nil, StatusNotFound
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, StatusNotFound
		}
		return leaf(parts, int64Bytes(n))
	case "code_details":
		if st.local != nil {
			return leaf(parts, []byte(st.local.Details))
		}
		return leaf(parts, []byte("via_upstream"))
	case "headers":
		return headersProperty(parts, st.resp)
	}
	return nil, StatusNotFound
}

// headersProperty serves <x>.headers (the whole map, pseudo-headers
// included, as Envoy's header maps hold them) and <x>.headers.<name>.
func headersProperty(parts []string, h Headers) ([]byte, Status) {
	switch len(parts) {
	case 1:
		return EncodePairs(h), StatusOK
	case 2:
		v, ok := h.Get(parts[1])
		if !ok {
			return nil, StatusNotFound
		}
		return []byte(v), StatusOK
	}
	return nil, StatusNotFound
}
