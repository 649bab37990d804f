package elastictrain_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/launch"
)

// workerMarker is the comment in README.md that precedes its worker program.
const workerMarker = "<!-- worker program: readme_test.go builds and runs the next go block -->"

// readme returns README.md (the test runs in the module's root directory).
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	return string(b)
}

// readmeWorker returns the Go program of the README's "A complete worker":
// the first go block after workerMarker.
func readmeWorker(t *testing.T) string {
	t.Helper()
	s := readme(t)
	i := strings.Index(s, workerMarker)
	require.GreaterOrEqual(t, i, 0, "README.md has no %q", workerMarker)
	s = s[i+len(workerMarker):]
	const open, end = "\n```go\n", "\n```\n"
	j := strings.Index(s, open)
	require.GreaterOrEqual(t, j, 0, "no go block after the marker")
	s = s[j+len(open):]
	k := strings.Index(s, end)
	require.GreaterOrEqual(t, k, 0, "the go block after the marker is not closed")
	return s[:k+1]
}

// The README stays short and describes what is: at most 300 lines, no
// change list, and the Quick start's two commands as they have always been.
func TestREADMEIsShort(t *testing.T) {
	s := readme(t)
	require.LessOrEqual(t, strings.Count(s, "\n"), 300, "README.md has more than 300 lines; move the detail to docs/")
	require.NotRegexp(t, regexp.MustCompile(`(?i)what\s+moved`), s, "changes go to CHANGELOG.md")
	require.Contains(t, s, "```sh\n"+
		"go run ./examples/mnist     # the main job: 2 worker processes train on the real MNIST files and print the test accuracy\n"+
		"go test ./...               # the test suite\n```\n")
}

// Every relative link of README.md, CHANGELOG.md and docs/ names a file that
// exists and, with a #fragment, a heading of that file (GitHub's anchors:
// lower case, punctuation dropped, spaces to hyphens).
func TestDocsLinksResolve(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	fence := regexp.MustCompile("(?s)```.*?```")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range append([]string{"README.md", "CHANGELOG.md"}, docs...) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(fence.ReplaceAllString(string(b), ""), -1) {
			if strings.Contains(m[1], "://") {
				continue
			}
			path, frag, _ := strings.Cut(m[1], "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
			}
			_, err := os.Stat(target)
			require.NoError(t, err, "%s links to %s", f, m[1])
			if frag != "" {
				require.Contains(t, anchors(t, target), frag, "%s links to %s: no such heading", f, m[1])
			}
		}
	}
}

// anchors returns the GitHub anchors of the headings of the Markdown file path.
func anchors(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []string
	text := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(string(b), "") // a "# comment" in a code block is no heading
	drop := regexp.MustCompile(`[^\pL\pN_\- ]`)
	for _, m := range regexp.MustCompile(`(?m)^#+\s+(.*?)\s*$`).FindAllStringSubmatch(text, -1) {
		out = append(out, strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-"))
	}
	return out
}

// The README's worker program is a real one: it builds against this
// module, and three of them, started as one job by package launch, train
// to the end and print an exact audit and the trainer's metrics.
func TestREADMEWorkerBuildsAndRuns(t *testing.T) {
	src := readmeWorker(t)
	gobin, err := exec.LookPath("go") // go test puts its own toolchain first in PATH
	require.NoError(t, err)
	root, err := os.Getwd()
	require.NoError(t, err)
	dir := t.TempDir()
	main := filepath.Join(dir, "main.go")
	require.NoError(t, os.WriteFile(main, []byte(src), 0o644))
	// An overlay places the program in a package of this module without
	// writing into the checkout: the build uses the module's go.mod and
	// go.sum, and needs no module that `go test ./...` does not.
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "readme-worker", "main.go"): main},
	})
	require.NoError(t, err)
	ovPath := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(ovPath, overlay, 0o644))
	bin := filepath.Join(dir, "worker")
	build := exec.CommandContext(t.Context(), gobin, "build", "-overlay", ovPath, "-o", bin, "./readme-worker")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building the README's worker:\n%s", out)

	var stdout, stderr bytes.Buffer
	cfg := launch.DefaultConfig()
	cfg.Workers = 3
	res, err := launch.Run(t.Context(), launch.Spec{
		Command: []string{bin, "-dir", filepath.Join(dir, "run")},
		Stdout:  &stdout,
		Stderr:  &stderr,
	}, cfg)
	require.NoError(t, err, "workers' stderr:\n%s", stderr.String())
	require.Equal(t, launch.Finished, res.Outcome, "workers' stderr:\n%s", stderr.String())
	require.Contains(t, stdout.String(), "step 320: ", "5 epochs of 64 global batches")
	require.Contains(t, stdout.String(), "audit: 0 missing, 0 duplicates")
	// 20480 (5 x 4096) when no round failed; a round that failed on a
	// loaded machine moves the count, not the point: the trainer's counters
	// reached the program's MeterProvider.
	require.Regexp(t, `(?m)^elastictrain\.samples [1-9][0-9]*$`, stdout.String(), "the MeterProvider got the trainer's counters")
}
