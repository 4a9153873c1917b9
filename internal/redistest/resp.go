package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// replyError is an error reply from Redis ("-ERR ...").
type replyError string

func (e replyError) Error() string { return "redis: " + string(e) }

// commandTLS sends one command to the Redis server at addr on a fresh connection, over TLS with the
// client configuration tc (nil: plaintext), and returns its reply: the text of a simple string, the
// digits of an integer, or the content of a bulk string. An error reply is returned as a replyError.
// Arrays are not supported; the helpers here do not need them.
func commandTLS(addr string, tc *tls.Config, timeout time.Duration, args ...string) (string, error) {
	d := &net.Dialer{Timeout: timeout}
	var conn net.Conn
	var err error
	if tc != nil {
		conn, err = tls.DialWithDialer(d, "tcp", addr, tc)
	} else {
		conn, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

// readReply reads one RESP2 reply that is not an array.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("redis: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", replyError(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 {
			return "", fmt.Errorf("redis: bad bulk length %q", line)
		}
		if n == -1 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("redis: unsupported reply %q", line)
}
