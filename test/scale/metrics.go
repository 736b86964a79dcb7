package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// samples is one scrape of a Prometheus text exposition: each series
// line's name with labels ("name{a=\"b\"}") and value.
type samples map[string]float64

// parseSamples reads the text exposition format, skipping comments.
func parseSamples(r io.Reader) (samples, error) {
	out := samples{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The value follows the last space outside the labels; a
		// timestamp may follow it.
		series, rest := line, ""
		if i := strings.LastIndexByte(line, '}'); i >= 0 {
			series, rest = line[:i+1], strings.TrimSpace(line[i+1:])
		} else if f := strings.Fields(line); len(f) >= 2 {
			series, rest = f[0], f[1]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("parse metrics line %q: %w", line, err)
		}
		out[series] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

// get returns the value of the series without labels.
func (s samples) get(name string) float64 { return s[name] }

// sum adds the values of every series of name whose labels contain all
// of the given `key="value"` pairs.
func (s samples) sum(name string, labels ...string) float64 {
	var total float64
	for series, v := range s {
		base, lbls, _ := strings.Cut(series, "{")
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(lbls, l) {
				ok = false
				break
			}
		}
		if ok {
			total += v
		}
	}
	return total
}

// scrape fetches url's metrics with the given client.
func scrape(ctx context.Context, c *http.Client, url string) (samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	return parseSamples(resp.Body)
}
