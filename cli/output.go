package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/yaml"
)

// output is a parsed -o: human (the command's own text), json, yaml or a
// JSONPath template.
type output struct {
	format string
	path   *jsonpath.JSONPath
}

// The -o formats.
const (
	formatHuman    = ""
	formatJSON     = "json"
	formatYAML     = "yaml"
	formatJSONPath = "jsonpath"
)

// outputFlag registers -o on cmd and returns where its value lands.
func outputFlag(cmd *cobra.Command) *string {
	return cmd.Flags().StringP("output", "o", "", "Output format: json, yaml or jsonpath='{...}'")
}

// parseOutput reads -o: "", "json", "yaml" or "jsonpath=TEMPLATE" (the
// template may be quoted, as in jsonpath='{.id}').
func parseOutput(s string) (output, error) {
	switch s {
	case formatHuman, formatJSON, formatYAML:
		return output{format: s}, nil
	}
	tmpl, ok := strings.CutPrefix(s, formatJSONPath+"=")
	if !ok {
		return output{}, fmt.Errorf("unknown output format -o %q: use json, yaml or jsonpath='{...}'", s)
	}
	if len(tmpl) >= 2 && (tmpl[0] == '\'' || tmpl[0] == '"') && tmpl[len(tmpl)-1] == tmpl[0] {
		tmpl = tmpl[1 : len(tmpl)-1]
	}
	if tmpl == "" {
		return output{}, fmt.Errorf("-o jsonpath needs a template, e.g. -o jsonpath='{.status.state}'")
	}
	p := jsonpath.New("output").AllowMissingKeys(true)
	if err := p.Parse(tmpl); err != nil {
		return output{}, fmt.Errorf("invalid -o jsonpath template %q: %w", tmpl, err)
	}
	return output{format: formatJSONPath, path: p}, nil
}

// human reports whether the command prints its own text.
func (o output) human() bool { return o.format == formatHuman }

// print writes v as JSON (indented), YAML or through the JSONPath
// template (ending with a newline unless the template printed one). v is encoded with its JSON tags in every format, so YAML keys
// and JSONPath fields are the JSON names.
func (o output) print(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	switch o.format {
	case formatYAML:
		y, err := yaml.JSONToYAML(data)
		if err != nil {
			return fmt.Errorf("encode output as YAML: %w", err)
		}
		_, err = w.Write(y)
		return err
	case formatJSONPath:
		var obj any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&obj); err != nil {
			return fmt.Errorf("decode output for jsonpath: %w", err)
		}
		var buf bytes.Buffer
		if err := o.path.Execute(&buf, obj); err != nil {
			return fmt.Errorf("-o jsonpath: %w", err)
		}
		if !bytes.HasSuffix(buf.Bytes(), []byte("\n")) {
			buf.WriteByte('\n')
		}
		_, err := w.Write(buf.Bytes())
		return err
	}
	_, err = w.Write(append(data, '\n'))
	return err
}

// table aligns tab-separated cells into columns as cilium-dbg does
// (minimum width 5, three spaces between columns) and drops the trailing
// spaces that padding empty last cells leaves.
type table struct {
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newTable() *table {
	t := &table{}
	t.tw = tabwriter.NewWriter(&t.buf, 5, 0, 3, ' ', 0)
	return t
}

// row writes one line of cells.
func (t *table) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

// flush writes the aligned table to w.
func (t *table) flush(w io.Writer) error {
	if err := t.tw.Flush(); err != nil {
		return err
	}
	var out bytes.Buffer
	for line := range strings.Lines(t.buf.String()) {
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	_, err := w.Write(out.Bytes())
	return err
}
