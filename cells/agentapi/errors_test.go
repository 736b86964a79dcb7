package agentapi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
)

func TestErrorCodes(t *testing.T) {
	errMissing := errors.New("thing not found")
	errBusy := errors.New("thing busy")
	codes := agentapi.ErrorCodes{
		{Err: errMissing, Code: http.StatusNotFound},
		{Err: errBusy, Code: http.StatusConflict},
	}
	for _, tc := range []struct {
		err  error
		code int
	}{
		{errMissing, http.StatusNotFound},
		{fmt.Errorf("get thing 7: %w", errMissing), http.StatusNotFound},
		{fmt.Errorf("put: %w", errors.Join(errBusy, errMissing)), http.StatusNotFound}, // first entry wins
		{fmt.Errorf("put: %w", errBusy), http.StatusConflict},
		{errors.New("disk on fire"), http.StatusInternalServerError},
	} {
		rec := httptest.NewRecorder()
		codes.Write(rec, tc.err)
		var body models.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", tc.err, rec.Body, err)
		}
		if rec.Code != tc.code || body.Code != tc.code || body.Message != tc.err.Error() {
			t.Errorf("%v: got %d %+v, want %d with the error's text", tc.err, rec.Code, body, tc.code)
		}
	}
}
