// Command ratectl manages sluice's rate-limit policies at run time: apply,
// get, list, delete and watch them through the control plane's policy
// service, and check what the decision API answers for a request.
//
//	ratectl apply -f policy.yaml
//	ratectl get api
//	ratectl check api remote_address=10.0.0.1 path=/login
//
// Run `ratectl help` for every command and flag. Exit codes: 0 done,
// 1 refused, invalid or failed, 2 wrong usage.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Exit codes.
const (
	exitOK    = 0 // done
	exitFail  = 1 // refused, invalid or failed
	exitUsage = 2 // wrong usage
)

// Defaults of the global flags.
const (
	defaultServer    = "127.0.0.1:8082" // the policy service (the server's policy listener)
	defaultRLSServer = "127.0.0.1:8081" // the decision API (server.DefaultGRPCAddr, as envoyproxy/ratelimit)
	defaultTimeout   = 10 * time.Second
)

// Environment variables read for defaults.
const (
	envServer    = "SLUICE_SERVER"
	envRLSServer = "SLUICE_RLS_SERVER"
	envToken     = "SLUICE_TOKEN"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// env is ratectl's view of its process: arguments aside, everything a
// command reads or writes, so tests can run it in-process.
type env struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	g      globals
}

// globals are the flags every command takes.
type globals struct {
	server     string        // policy service address
	rlsServer  string        // decision API address
	token      string        // bearer token (--token)
	tokenFile  string        // file holding the bearer token
	output     string        // text, yaml or json
	timeout    time.Duration // per call (not watch)
	useTLS     bool          // TLS even without the flags below
	caFile     string        // CA to verify the server with
	certFile   string        // client certificate (mTLS)
	keyFile    string        // its key
	serverName string        // name to verify in the server's certificate
	version    bool          // --version: print and exit
}

// register adds the global flags to fs, with defaults from the environment.
func (g *globals) register(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&g.server, "server", orDefault(getenv(envServer), defaultServer), "policy service `address` (env "+envServer+")")
	fs.StringVar(&g.rlsServer, "rls-server", orDefault(getenv(envRLSServer), defaultRLSServer), "decision API `address`, for check (env "+envRLSServer+")")
	fs.StringVar(&g.token, "token", "", "bearer `token` (visible to other users in the process list: prefer --token-file or "+envToken+")")
	fs.StringVar(&g.tokenFile, "token-file", "", "`file` holding the bearer token (default: env "+envToken+")")
	fs.StringVar(&g.output, "output", "text", "output `format`: text, yaml or json")
	fs.StringVar(&g.output, "o", "text", "shorthand for --output `format`")
	fs.DurationVar(&g.timeout, "timeout", defaultTimeout, "how long one call may take")
	fs.BoolVar(&g.useTLS, "tls", false, "connect with TLS (implied by --ca-file, --cert)")
	fs.StringVar(&g.caFile, "ca-file", "", "PEM `file` of the CA that signed the server's certificate (default: the system's)")
	fs.StringVar(&g.certFile, "cert", "", "client certificate PEM `file`, for mTLS")
	fs.StringVar(&g.keyFile, "key", "", "client key PEM `file`, for mTLS")
	fs.StringVar(&g.serverName, "server-name", "", "`name` to expect in the server's certificate (default: the address's host)")
	fs.BoolVar(&g.version, "version", false, "print the version, commit and Go version, and exit")
}

// orDefault returns s, or def when s is empty.
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// usageError is wrong usage: exit code 2.
type usageError struct{ msg string }

// Error returns the message.
func (e *usageError) Error() string { return e.msg }

// usagef returns a usageError.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// runner runs a command with its positional arguments.
type runner func(ctx context.Context, e *env, args []string) error

// command is one subcommand.
type command struct {
	name    string
	args    string                        // synopsis of the positional arguments and own flags
	summary string                        // one line
	setup   func(fs *flag.FlagSet) runner // registers the command's flags; the runner reads them
}

// commands lists the subcommands in help order.
var commands []*command

func init() {
	commands = []*command{applyCmd, getCmd, listCmd, deleteCmd, watchCmd, checkCmd}
}

// run runs ratectl with args and returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	err := dispatch(ctx, e, args)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "ratectl: %s\n", ue.msg)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "ratectl: %s\n", err)
		return exitFail
	}
}

// dispatch parses the global flags and runs the command.
func dispatch(ctx context.Context, e *env, args []string) error {
	top := flag.NewFlagSet("ratectl", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	e.g.register(top, e.getenv)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(e.stdout)
			return err
		}
		return usagef("%v (run `ratectl help`)", err)
	}
	if e.g.version {
		fmt.Fprintln(e.stdout, "ratectl", version.Get())
		return nil
	}
	rest := top.Args()
	if len(rest) == 0 {
		printHelp(e.stderr)
		return usagef("no command given")
	}
	name := rest[0]
	if name == "help" {
		if len(rest) > 1 {
			if c := findCommand(rest[1]); c != nil {
				printCommandHelp(e.stdout, c)
				return nil
			}
			return usagef("help: unknown command %q (commands: %s)", rest[1], commandNames())
		}
		printHelp(e.stdout)
		return nil
	}
	c := findCommand(name)
	if c == nil {
		return usagef("unknown command %q (commands: %s; run `ratectl help`)", name, commandNames())
	}
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	// The global flags may also follow the command; their values so far
	// (from before the command) are the defaults.
	g := e.g
	fs.StringVar(&e.g.server, "server", g.server, "")
	fs.StringVar(&e.g.rlsServer, "rls-server", g.rlsServer, "")
	fs.StringVar(&e.g.token, "token", g.token, "")
	fs.StringVar(&e.g.tokenFile, "token-file", g.tokenFile, "")
	fs.StringVar(&e.g.output, "output", g.output, "")
	fs.StringVar(&e.g.output, "o", g.output, "")
	fs.DurationVar(&e.g.timeout, "timeout", g.timeout, "")
	fs.BoolVar(&e.g.useTLS, "tls", g.useTLS, "")
	fs.StringVar(&e.g.caFile, "ca-file", g.caFile, "")
	fs.StringVar(&e.g.certFile, "cert", g.certFile, "")
	fs.StringVar(&e.g.keyFile, "key", g.keyFile, "")
	fs.StringVar(&e.g.serverName, "server-name", g.serverName, "")
	fs.BoolVar(&e.g.version, "version", g.version, "")
	runCmd := c.setup(fs)
	pos, err := parseInterleaved(fs, rest[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printCommandHelp(e.stdout, c)
			return err
		}
		return usagef("%s: %v (run `ratectl help %s`)", c.name, err, c.name)
	}
	if e.g.version {
		fmt.Fprintln(e.stdout, "ratectl", version.Get())
		return nil
	}
	if err := e.g.check(); err != nil {
		return err
	}
	return runCmd(ctx, e, pos)
}

// check validates the global flags.
func (g *globals) check() error {
	switch g.output {
	case "text", "yaml", "json":
	default:
		return usagef("--output %q: want text, yaml or json", g.output)
	}
	if g.token != "" && g.tokenFile != "" {
		return usagef("--token and --token-file both given: use one")
	}
	if (g.certFile == "") != (g.keyFile == "") {
		return usagef("--cert and --key go together: give both for mTLS")
	}
	if g.timeout <= 0 {
		return usagef("--timeout must be positive (got %v)", g.timeout)
	}
	return nil
}

// parseInterleaved parses fs from args, letting flags and positional
// arguments mix; everything after "--" is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// findCommand returns the named command, or nil.
func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// commandNames lists the commands.
func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// printHelp writes the overall help.
func printHelp(w io.Writer) {
	fmt.Fprint(w, `ratectl manages sluice's rate-limit policies at run time.

Usage: ratectl [flags] COMMAND [arguments] [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "ratectl help COMMAND" for a command's arguments.

Flags (before or after the command):
`)
	fs := flag.NewFlagSet("ratectl", flag.ContinueOnError)
	var g globals
	g.register(fs, func(string) string { return "" })
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, `
Credentials for the policy service: --token-file, --token or $%s (a bearer
token), and/or --cert/--key (a client certificate). check talks to the
decision API, which needs none.

Exit codes: 0 done, 1 refused, invalid or failed, 2 wrong usage.
`, envToken)
}

// printCommandHelp writes one command's help.
func printCommandHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "Usage: ratectl %s %s\n\n%s\n", c.name, c.args, c.summary)
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.setup(fs)
	if n := countFlags(fs); n > 0 {
		fs.SetOutput(w)
		fmt.Fprintln(w, "\nFlags:")
		fs.PrintDefaults()
	}
	fmt.Fprintln(w, "\nThe global flags (ratectl help) are accepted too.")
}

// countFlags returns how many flags fs defines.
func countFlags(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n
}

// token returns the bearer token to send: --token, else --token-file, else
// $SLUICE_TOKEN; "" for none.
func (e *env) token() (string, error) {
	switch {
	case e.g.token != "":
		return e.g.token, nil
	case e.g.tokenFile != "":
		data, err := os.ReadFile(e.g.tokenFile)
		if err != nil {
			return "", fmt.Errorf("--token-file: %v", err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				return t, nil
			}
		}
		return "", fmt.Errorf("--token-file %s holds no token", e.g.tokenFile)
	}
	return strings.TrimSpace(e.getenv(envToken)), nil
}

// dial connects to addr with the transport the flags ask for.
func (e *env) dial(addr string) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, usagef("empty server address")
	}
	creds, err := e.transport()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("server address %q: %v", addr, err)
	}
	return conn, nil
}

// transport returns the transport credentials: TLS when asked for.
func (e *env) transport() (credentials.TransportCredentials, error) {
	if !e.g.useTLS && e.g.caFile == "" && e.g.certFile == "" {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: e.g.serverName}
	if e.g.caFile != "" {
		data, err := os.ReadFile(e.g.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", e.g.caFile)
		}
		cfg.RootCAs = pool
	}
	if e.g.certFile != "" {
		cert, err := tls.LoadX509KeyPair(e.g.certFile, e.g.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert %s / --key %s: %v", e.g.certFile, e.g.keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg), nil
}

// authContext adds the bearer token, if any, to ctx.
func (e *env) authContext(ctx context.Context) (context.Context, error) {
	t, err := e.token()
	if err != nil || t == "" {
		return ctx, err
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+t), nil
}

// target names a server ratectl talks to, for error messages.
type target struct {
	what string // "policy service" or "decision API"
	addr string // its address
	flag string // the flag that sets it
	env  string // the environment variable that sets it
}

// policyTarget is the policy service.
func (e *env) policyTarget() target {
	return target{"policy service", e.g.server, "--server", envServer}
}

// rlsTarget is the decision API.
func (e *env) rlsTarget() target {
	return target{"decision API", e.g.rlsServer, "--rls-server", envRLSServer}
}

// decisionAPIServes reports whether the decision API (--rls-server) answers
// a gRPC health check within a second: the control plane is up.
// Any gRPC answer counts, even Unimplemented.
func (e *env) decisionAPIServes() bool {
	conn, err := e.dial(e.g.rlsServer)
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), min(time.Second, e.g.timeout))
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false // nothing answered
	}
	return true // an answer, even Unimplemented, is a gRPC server there
}

// explain turns a gRPC error into what the operator should know and do.
func (e *env) explain(err error, t target) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unauthenticated:
		return fmt.Errorf("refused by the %s at %s: %s\n(give credentials: --token-file FILE, --token TOKEN or $%s; or --cert and --key for mTLS)",
			t.what, t.addr, msg, envToken)
	case codes.PermissionDenied:
		return fmt.Errorf("refused by the %s at %s: %s", t.what, t.addr, msg)
	case codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound:
		return errors.New(msg)
	case codes.Unavailable:
		if t.what == "policy service" && e.decisionAPIServes() {
			return fmt.Errorf("cannot reach the policy service at %s: %s\n(the control plane is running: its decision API at %s answers; "+
				"but its policy service is off unless it has a token ($SLUICE_TOKEN or -policy-token-file) or a client CA (-policy-client-ca), "+
				"and its log then says \"policy service off\"; or it listens elsewhere: -policy-addr, and %s or $%s here)",
				t.addr, msg, e.g.rlsServer, t.flag, t.env)
		}
		return fmt.Errorf("cannot reach the %s at %s: %s\n(check the address (%s or $%s), the TLS flags, and that the control plane is running)",
			t.what, t.addr, msg, t.flag, t.env)
	case codes.DeadlineExceeded:
		return fmt.Errorf("no answer from the %s at %s within %v (raise --timeout if it is just slow)", t.what, t.addr, e.g.timeout)
	case codes.Unimplemented:
		return fmt.Errorf("%s does not serve the %s (%s): is %s the right listener?", t.addr, t.what, msg, t.flag)
	}
	return fmt.Errorf("the %s at %s failed: %s: %s", t.what, t.addr, st.Code(), msg)
}
