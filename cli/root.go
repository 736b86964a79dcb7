package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
)

// DefaultTimeout bounds one command's exchange with the agent (--timeout).
const DefaultTimeout = 30 * time.Second

// Options are what a command writes to and reads the time from. Zero
// values mean os.Stdout, os.Stderr and time.Now.
type Options struct {
	// Out receives the command's output.
	Out io.Writer
	// Err receives error messages.
	Err io.Writer
	// Now is the clock status uses to print the age of health reports.
	Now func() time.Time
	// Getenv reads the environment (SocketEnv); nil means os.Getenv.
	Getenv func(string) string
}

// SocketEnv names the environment variable that gives the agent's socket
// path when -H is not given (as Cilium's CILIUM_SOCK): the agent's
// DaemonSet sets it in the agent's container, so that `kubectl exec
// ds/cellium-agent -- cellium status` finds the socket wherever the chart
// put it.
const SocketEnv = "CELLIUM_SOCK"

func (o Options) withDefaults() Options {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Err == nil {
		o.Err = os.Stderr
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	return o
}

// Run executes the cellium command line args (without the program name)
// and returns the process exit code: 0 on success, 1 when the command
// failed, including when the agent is unreachable or `status` finds it
// unhealthy. Errors are printed to opts.Err as "Error: <message>".
func Run(ctx context.Context, args []string, opts Options) int {
	opts = opts.withDefaults()
	cmd := NewCommand(opts)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(opts.Err, "Error: %v\n", err)
		return 1
	}
	return 0
}

// app is the state the subcommands share: the global flags and where to
// write.
type app struct {
	opts    Options
	host    string
	timeout time.Duration
}

// NewCommand returns the root `cellium` command with every subcommand.
// Each command that talks to the agent opens a client for its own run and
// closes it before returning.
func NewCommand(opts Options) *cobra.Command {
	opts = opts.withDefaults()
	a := &app{opts: opts}
	root := &cobra.Command{
		Use:   "cellium",
		Short: "Inspect the local cellium agent: health, endpoints, identities, nodes, configuration",
		Long: `cellium talks to the cellium agent of this node over its API socket
(-H, else $` + SocketEnv + `, else ` + client.DefaultSocketPath + `) and prints
what the agent knows. Most commands that print an object take
-o json|yaml|jsonpath='{...}'.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(opts.Out)
	root.SetErr(opts.Err)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())
	})
	defaultSocket := client.DefaultSocketPath
	if p := opts.Getenv(SocketEnv); p != "" {
		defaultSocket = p
	}
	root.PersistentFlags().StringVarP(&a.host, "host", "H", "unix://"+defaultSocket,
		"The agent's API socket, as unix:///path/to/cellium.sock (default: $"+SocketEnv+" if set)")
	root.PersistentFlags().DurationVar(&a.timeout, "timeout", DefaultTimeout,
		"Give up when the agent has not answered within this time")
	root.AddCommand(
		a.statusCommand(),
		a.endpointCommand(),
		a.identityCommand(),
		a.policyCommand(),
		a.nodeCommand(),
		a.ipcacheCommand(),
		a.serviceCommand(),
		a.configCommand(),
		a.statedbCommand(),
		a.doctorCommand(),
		a.healthCommand(),
		a.monitorCommand(),
	)
	return root
}

// socketPath turns -H into a socket path: "unix:///path" or a bare path.
func socketPath(host string) (string, error) {
	switch {
	case host == "":
		return client.DefaultSocketPath, nil
	case strings.HasPrefix(host, "unix://"):
		if p := strings.TrimPrefix(host, "unix://"); p != "" {
			return p, nil
		}
	case !strings.Contains(host, "://"):
		return host, nil
	}
	return "", fmt.Errorf("invalid -H %q: the agent listens on a unix socket; give it as unix:///path/to/cellium.sock", host)
}

// call runs fn with a client of the agent and a context bounded by
// --timeout, then turns the client's errors into messages for a person.
func (a *app) call(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	path, err := socketPath(a.host)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	if a.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.timeout)
		defer cancel()
	}
	c := client.New(path)
	defer c.Close()
	return a.explainTransport(fn(ctx, c), path)
}

// explainTransport turns the client's errors about reaching the agent at
// path into messages that say what to do; other errors pass unchanged.
func (a *app) explainTransport(err error, path string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, client.ErrAgentUnreachable) && errors.Is(err, os.ErrPermission):
		return fmt.Errorf("cannot reach the cellium agent at unix://%s: permission denied: the socket is mode 0660, run cellium as root (or a member of the socket's group)", path)
	case errors.Is(err, client.ErrAgentUnreachable):
		return fmt.Errorf("cannot reach the cellium agent at unix://%s: is cellium-agent running? (-H to use another socket)", path)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the cellium agent at unix://%s did not answer within %s (--timeout to wait longer)", path, a.timeout)
	}
	return err
}
