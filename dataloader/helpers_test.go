package dataloader

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// Small assertion helpers (the standard library only: testify's require
// needs a go.sum entry the module does not have yet).

func msg(args []any) string {
	if len(args) == 0 {
		return ""
	}
	if f, ok := args[0].(string); ok {
		return ": " + fmt.Sprintf(f, args[1:]...)
	}
	return ": " + fmt.Sprint(args...)
}

func mustEqual(t testing.TB, want, got any, args ...any) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("want %v, got %v%s", want, got, msg(args))
	}
}

func mustTrue(t testing.TB, ok bool, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf("condition false%s", msg(args))
	}
}

func mustNoError(t testing.TB, err error, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error %v%s", err, msg(args))
	}
}

func mustErrorIs(t testing.TB, err, target error, args ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("want error matching %v, got %v%s", target, err, msg(args))
	}
}
