package ranks

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestQuantile(t *testing.T) {
	s := []float64{1, 2, 3, 4}
	if q := Quantile(s, 0.5); q != 2.5 {
		t.Fatalf("median %v", q)
	}
	if q := Quantile(s, 1); q != 4 {
		t.Fatalf("max %v", q)
	}
	if q := Quantile(nil, 0.5); q != 0 {
		t.Fatalf("empty %v", q)
	}
}

func TestNearestRankTakesAValueWithoutInterpolating(t *testing.T) {
	s := []float64{1, 2, 3, 4}
	for _, tc := range []struct{ q, want float64 }{{0, 1}, {0.5, 3}, {0.9, 4}, {1, 4}} {
		if got := NearestRank(s, tc.q); got != tc.want {
			t.Errorf("NearestRank(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if q := NearestRank(nil, 0.5); q != 0 {
		t.Fatalf("empty %v", q)
	}
}

func TestSlowestTakesEachIterationsMaximumOverRanksSorted(t *testing.T) {
	got := Slowest([][]float64{{3, 1, 5}, {2, 4, 1}})
	if want := []float64{3, 4, 5}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestParseListSkipsBlanksAndNamesAnEmptyList(t *testing.T) {
	got, err := ParseList(" 1, ,2,3 ", "numbers", strconv.Atoi)
	if err != nil || !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := ParseList(" , ", "numbers", strconv.Atoi); err == nil || err.Error() != "no numbers" {
		t.Fatalf("empty list: %v", err)
	}
	bad := errors.New("bad")
	if _, err := ParseList("1,x", "numbers", func(string) (int, error) { return 0, bad }); !errors.Is(err, bad) {
		t.Fatalf("parse error: %v", err)
	}
}
