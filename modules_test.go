package elastictrain_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goCmd runs the go command in the repository's root with GOWORK set to
// gowork ("off", or the path of a go.work file) and returns its standard
// output. It skips the test when there is no go command to run.
func goCmd(t *testing.T, gowork string, args ...string) []byte {
	t.Helper()
	gobin, err := exec.LookPath("go") // go test puts its own toolchain first in PATH
	if errors.Is(err, exec.ErrNotFound) {
		t.Skipf("no go command in PATH to list the modules with: %v", err)
	}
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), gobin, args...)
	cmd.Env = append(os.Environ(), "GOWORK="+gowork)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "GOWORK=%s go %s:\n%s", gowork, strings.Join(args, " "), stderr.Bytes())
	return out
}

// versions runs go list -m all (which reads go.mod files and builds
// nothing) with GOWORK set to gowork and returns each module's version,
// with its replacement's after " => " when it has one.
func versions(t *testing.T, gowork string) map[string]string {
	t.Helper()
	out := goCmd(t, gowork, "list", "-m", "-f", "{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}", "all")
	v := map[string]string{}
	for line := range strings.Lines(string(out)) {
		path, version, _ := strings.Cut(strings.TrimSpace(line), " ")
		v[path] = version
	}
	return v
}

// workspace returns the absolute path of the repository's go.work.
func workspace(t *testing.T) string {
	t.Helper()
	root, err := os.Getwd()
	require.NoError(t, err)
	return filepath.Join(root, "go.work")
}

// Issue #31, must show 4: one go.work at the root uses every module of the
// repository, so one build list holds for all of them, and the core module
// is tested (go test ./... at the root, in the workspace) with the
// versions its go.mod gives a program that requires it. Every module the
// core takes code from (each requirement of its go.mod, which go mod tidy
// keeps to the modules that provide packages to some build of the core's
// packages and tests, and the module of each package its tests build
// here) has the same version in the core built alone (GOWORK=off) as in
// the workspace. When another module raises one of these in the
// workspace, go work sync raises the core's go.mod to it (for the modules
// of this platform's build; GOWORK=off go get PATH@VERSION at the root for
// one it leaves lower). The listing of the packages also fails if a core
// package imports one that only another module of the workspace requires.
//
// Modules of the graph that provide the core no package (those the old
// go.mod files of gorgonia's and arrow's dependencies require, such as
// google.golang.org/grpc v1.39.0) may differ: they put no code in any
// build of the core, and go mod tidy would drop a requirement that raised
// them. Their count is logged.
func TestCoreVersionsMatchTheWorkspace(t *testing.T) {
	alone := versions(t, "off")
	inWorkspace := versions(t, workspace(t))

	used := map[string]bool{}
	var gomod struct{ Require []struct{ Path string } }
	require.NoError(t, json.Unmarshal(goCmd(t, "off", "mod", "edit", "-json"), &gomod))
	for _, r := range gomod.Require {
		used[r.Path] = true
	}
	require.NotEmpty(t, used)
	requireSame := func() {
		t.Helper()
		var differ []string
		for path := range used {
			v, ok := alone[path]
			w := inWorkspace[path]
			switch {
			case !ok:
				differ = append(differ, path+": not in the module graph of the core built alone")
			case v != w:
				differ = append(differ, path+": "+v+" built alone, "+w+" in the workspace")
			}
		}
		slices.Sort(differ)
		require.Empty(t, differ, "modules the core takes code from at another version in the workspace (go work sync; GOWORK=off go get PATH@VERSION at the root for one it leaves lower):\n%s", strings.Join(differ, "\n"))
	}
	requireSame()
	// The modules of the packages the core's tests build on this platform
	// (no build: go list reads the files' imports), the core's own left
	// out by -f. A package that only another module of the workspace
	// provides fails go list here, built alone.
	deps := goCmd(t, "off", "list", "-deps", "-test", "-f", "{{with .Module}}{{if not .Main}}{{.Path}}{{end}}{{end}}", "./...")
	for line := range strings.Lines(string(deps)) {
		if p := strings.TrimSpace(line); p != "" {
			used[p] = true
		}
	}
	requireSame()

	graphOnly, graphOnlyDiffer := 0, 0
	for path, v := range alone {
		if v == "" || used[path] { // the core itself, or checked above
			continue
		}
		graphOnly++
		if w, ok := inWorkspace[path]; !ok || w != v {
			graphOnlyDiffer++
		}
	}
	t.Logf("%d modules the core takes code from, at the same versions alone and in the workspace; %d of the %d others of its module graph differ", len(used), graphOnlyDiffer, graphOnly)
}

// Issue #31, must show 4: the root's go.work uses every module of the
// repository (every directory with a go.mod outside testdata), so that
// cd DIR && go test ./... uses it in each, and nothing else.
func TestWorkspaceUsesEveryModule(t *testing.T) {
	root, err := os.Getwd()
	require.NoError(t, err)
	var mods []string
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "go.mod" {
			mods = append(mods, filepath.Join(root, filepath.Dir(path)))
		}
		return nil
	})
	require.NoError(t, err)
	var used []string
	for line := range strings.Lines(string(goCmd(t, workspace(t), "list", "-m", "-f", "{{.Dir}}"))) {
		used = append(used, strings.TrimSpace(line))
	}
	slices.Sort(mods)
	slices.Sort(used)
	require.Equal(t, mods, used, "the directories with a go.mod, and those go.work uses")
	require.GreaterOrEqual(t, len(used), 8)
}
