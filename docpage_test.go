package elastictrain_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// deprecatedNames returns the exported names of the package in dir whose
// documentation says "Deprecated:" (a const or var group counts when its
// doc or any of its specs' comments does), as go doc shows them.
func deprecatedNames(t *testing.T, dir string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	require.NoError(t, err)
	require.Len(t, pkgs, 1)
	var files []*ast.File
	for _, p := range pkgs {
		for _, f := range p.Files {
			files = append(files, f)
		}
	}
	p, err := doc.NewFromFiles(fset, files, "example.com/"+dir)
	require.NoError(t, err)
	out := map[string]bool{}
	dep := func(s string) bool { return strings.Contains(s, "Deprecated:") }
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			d := dep(v.Doc)
			for _, s := range v.Decl.Specs {
				vs := s.(*ast.ValueSpec)
				d = d || dep(vs.Doc.Text()) || dep(vs.Comment.Text())
			}
			for _, n := range v.Names {
				out[n] = d
			}
		}
	}
	funcs := func(fs []*doc.Func) {
		for _, f := range fs {
			out[f.Name] = dep(f.Doc)
		}
	}
	values(p.Consts)
	values(p.Vars)
	funcs(p.Funcs)
	for _, ty := range p.Types {
		out[ty.Name] = dep(ty.Doc)
		values(ty.Consts)
		values(ty.Vars)
		funcs(ty.Funcs)
	}
	return out
}

// Issue #31, must show 1: the trainer's page (go doc -short) is at most
// 45 lines, not counting the names whose doc says Deprecated: (aliases
// and wrappers kept for one release after a move).
func TestTrainersUserPageIsShort(t *testing.T) {
	gobin, err := exec.LookPath("go")
	require.NoError(t, err)
	page, err := exec.CommandContext(t.Context(), gobin, "doc", "-short", "./trainer").Output()
	require.NoError(t, err)
	deprecated := deprecatedNames(t, "trainer")
	name := regexp.MustCompile(`^\s*(?:const|var|func|type)\s+(\w+)`)
	var kept []string
	for line := range strings.Lines(string(page)) {
		m := name.FindStringSubmatch(line)
		require.NotNil(t, m, "a go doc -short line without a name: %q", line)
		d, ok := deprecated[m[1]]
		require.True(t, ok, "go doc shows %s, which the package's files do not declare", m[1])
		if !d {
			kept = append(kept, line)
		}
	}
	require.LessOrEqual(t, len(kept), 45, "go doc -short ./trainer without deprecated names:\n%s", strings.Join(kept, ""))
	t.Logf("%d lines of %d without a Deprecated: note", len(kept), strings.Count(string(page), "\n"))
}

// Issue #31, must show 1: no exported name of elastic but a deprecated one
// is an SPI interface or a test helper: the store's interface, its request
// and view types and the stores live in elastic/store, the test kit in
// elastic/elastictest. What stays is what a worker calls or tests for:
// Agent, Config, World, Member (store.Member's alias: NewAgent takes one),
// the errors (StoreError is store.Error's alias) and the job ID's rule.
func TestElasticsPageHasNoSPI(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, "elastic", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	require.NoError(t, err)
	deprecated := deprecatedNames(t, "elastic")
	userAliases := map[string]bool{"Member": true, "StoreError": true}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.TYPE {
					continue
				}
				for _, s := range g.Specs {
					ts := s.(*ast.TypeSpec)
					if !ts.Name.IsExported() || deprecated[ts.Name.Name] {
						continue
					}
					_, iface := ts.Type.(*ast.InterfaceType)
					require.False(t, iface, "elastic exports the interface %s: an SPI belongs in elastic/store", ts.Name.Name)
					if ts.Assign.IsValid() {
						require.True(t, userAliases[ts.Name.Name], "elastic exports %s as an alias: a moved name is deprecated", ts.Name.Name)
					}
				}
			}
		}
	}
	for name, dep := range deprecated {
		if dep {
			continue
		}
		for _, spi := range []string{"ForTest", "Request", "View", "Hint", "Watcher", "MemoryStore", "RedisStore", "KeyPrefix"} {
			require.NotContains(t, name, spi, "elastic exports %s without a Deprecated: note: SPI and test names belong in elastic/store and elastic/elastictest", name)
		}
	}
}
