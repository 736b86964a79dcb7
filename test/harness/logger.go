package harness

import (
	"io"
	"log/slog"
)

// TextLogger logs to w as text without timestamps: the progress lines of
// the test commands (devcluster, e2enetpol), read by people as they come.
func TextLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}
