package elastictest_test

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/elastic/elastictest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestClusterFormsOneRound(t *testing.T) {
	c := elastictest.NewCluster(t, 4, elastictest.FastConfig("elastictest-job"))
	ws := c.JoinAll(context.Background())
	seen := map[int]bool{}
	for _, w := range ws {
		if w.Size != 4 || w.Round != ws[0].Round || seen[w.Rank] {
			t.Fatalf("worlds %+v", ws)
		}
		seen[w.Rank] = true
	}
}

// Example forms a round of three Agents. In a test, pass the test's t; the
// zero testing.T here only stands in for it (Cleanup never runs, so the
// agents are closed by hand).
func Example() {
	t := &testing.T{}
	c := elastictest.NewCluster(t, 3, elastictest.FastConfig("example"))
	ws := c.JoinAll(context.Background())
	fmt.Println(len(ws), ws[0].Size)
	for _, a := range c.Agents {
		_ = a.Close()
	}
	// Output: 3 3
}
