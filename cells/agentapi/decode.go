package agentapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// MaxRequestBodyBytes bounds the body of every API request (1 MiB). The
// largest real request, an endpoint with its labels, is a few KiB; the
// server stops reading a body at this size and answers 413.
const MaxRequestBodyBytes = 1 << 20

// Validator is implemented by request bodies that check their own fields
// (string lengths, ranges). DecodeJSON calls Validate after decoding; its
// error is the 400 answer's message, so it says which field is wrong and
// what is allowed.
type Validator interface {
	Validate() error
}

// DecodeJSON decodes the request body into v, which must be a pointer, and
// validates it. It is the one way handlers read a body: the body is
// limited to MaxRequestBodyBytes (413 beyond), unknown fields, a missing
// body and data after the JSON value are rejected (400), and when v
// implements Validator its error is a 400 too. what names the body in
// messages ("endpoint request"). On failure DecodeJSON has written the
// answer and returns false.
func DecodeJSON(w http.ResponseWriter, r *http.Request, what string, v any) bool {
	if err := decodeJSON(w, r, v); err != nil {
		code := http.StatusBadRequest
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			code = http.StatusRequestEntityTooLarge
			err = fmt.Errorf("body is larger than the limit of %d bytes", tooLarge.Limit)
		}
		WriteError(w, code, "decode %s: %v", what, err)
		return false
	}
	return true
}

func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength > MaxRequestBodyBytes {
		// Refuse before reading anything; the server closes the
		// connection rather than drain the body.
		return &http.MaxBytesError{Limit: MaxRequestBodyBytes}
	}
	body := http.MaxBytesReader(w, r.Body, MaxRequestBodyBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty body: send a JSON object")
		}
		return err
	}
	// Exactly one JSON value: anything but white space after it is an
	// error, so a truncated or concatenated request is not half-applied.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return err
		}
		return errors.New("unexpected data after the JSON object: send exactly one object")
	}
	if val, ok := v.(Validator); ok {
		if err := val.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// PathUint parses the path value name of r as a decimal number in
// [min, max]. On failure it writes a 400 naming what the value is ("endpoint
// ID") and what is allowed, and returns false.
func PathUint(w http.ResponseWriter, r *http.Request, name, what string, min, max uint64) (uint64, bool) {
	s := r.PathValue(name)
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n < min || n > max {
		WriteError(w, http.StatusBadRequest, "%s %q: want a number from %d to %d", what, truncate(s), min, max)
		return 0, false
	}
	return n, true
}

// QueryString returns the query parameter name of r, which must be at most
// maxLen bytes (and present when required). On failure it writes a 400
// saying what was wrong and returns false.
func QueryString(w http.ResponseWriter, r *http.Request, name string, maxLen int, required bool) (string, bool) {
	s := r.URL.Query().Get(name)
	if err := checkString(name, s, maxLen, required); err != nil {
		WriteError(w, http.StatusBadRequest, "%v", err)
		return "", false
	}
	return s, true
}

// checkString reports why s, the value of field, is not acceptable: empty
// when required, or longer than maxLen bytes.
func checkString(field, s string, maxLen int, required bool) error {
	switch {
	case required && s == "":
		return fmt.Errorf("%s is missing", field)
	case len(s) > maxLen:
		return fmt.Errorf("%s is %d bytes long, the limit is %d", field, len(s), maxLen)
	}
	return nil
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
