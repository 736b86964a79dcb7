package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
)

func (a *app) doctorCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this node's endpoints against IPAM, veths, state files, identities, CEPs and pods",
		Long: `doctor asks the agent to compare its endpoints with everything that must
agree with them: IPAM's allocations, the host's lxc veths, the endpoint
state files, the agent's identity references, the CiliumEndpoints of this
node and the pods scheduled to it. It prints each disagreement with what it
means and what to do, and exits 1 when there is any (or when the agent
cannot be asked). With -o json the output is always
{"findings":[{"kind":...,"object":...,"message":...,"hint":...}]}.`,
		Args: cobra.NoArgs,
	}
	out := outputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			r, err := c.GetDoctor(ctx)
			if err != nil {
				return explain(err, "run the doctor", "")
			}
			if o.human() {
				err = writeDoctor(a.opts.Out, r)
			} else {
				err = o.print(a.opts.Out, r)
			}
			if err != nil {
				return err
			}
			if n := len(r.Findings); n > 0 {
				return fmt.Errorf("the doctor found %d problem(s) on this node", n)
			}
			return nil
		})
	}
	return cmd
}

// writeDoctor prints the findings for a person.
func writeDoctor(w io.Writer, r *models.DoctorReport) error {
	var err error
	p := func(format string, args ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, args...)
		}
	}
	if len(r.Findings) == 0 {
		p("No problems found: endpoints, IP allocations, veths, state files, identity references, CiliumEndpoints and pods agree.\n")
	}
	for i, f := range r.Findings {
		if i > 0 {
			p("\n")
		}
		p("%s: %s\n  %s\n  What to do: %s\n", f.Kind, f.Object, f.Message, f.Hint)
	}
	if len(r.Findings) > 0 && len(r.Skipped) > 0 {
		p("\n")
	}
	for _, s := range r.Skipped {
		p("Not checked: %s\n", s)
	}
	return err
}
