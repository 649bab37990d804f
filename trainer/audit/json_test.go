package audit

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// File's hand-written lines are encoding/json's bytes for every kind
// of entry, so ReadLog and any JSON tool read them as before.
func TestAuditLinesAreEncodingJSONs(t *testing.T) {
	entries := []Entry{
		{},
		{Kind: "step", Gen: 1764600000123, Round: 3, Rank: 2, Step: 41, Epoch: 1, Indices: []int{5, 0, 59999, -1}, Base: 0},
		{Kind: "agreed", Gen: math.MaxUint64, Round: math.MaxUint64, Rank: -1, Step: math.MinInt64, Base: math.MaxInt64, Restored: true},
		{Kind: "step", Indices: []int{}, Epoch: -3},
		{Kind: "agreed", Gen: 7, Round: 2, Step: 12, Base: 3, Ended: true},
		{Kind: "odd \"kind\" <&> \\ \n é \u2028", Step: 1},
	}
	for _, e := range entries {
		want, err := json.Marshal(e)
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendAuditJSON(nil, e)))
	}
}

func BenchmarkAuditLine(b *testing.B) {
	e := Entry{Kind: "step", Gen: 1764600000123, Round: 1, Rank: 1, Step: 400, Indices: make([]int, 32)}
	for i := range e.Indices {
		e.Indices[i] = 1000 * i
	}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = appendAuditJSON(buf[:0], e)
	}
}
