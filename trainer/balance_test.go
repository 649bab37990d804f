package trainer

import "testing"

func TestAbsorbed(t *testing.T) {
	speeds := []float64{100, 100, 25}
	if !absorbed([]float64{40, 40, 12}, speeds, 2, nil) {
		t.Error("a slow rank whose share fits its speed (time within 1.25x of the median) is absorbed")
	}
	if absorbed([]float64{32, 32, 32}, speeds, 2, nil) {
		t.Error("a slow rank at an equal share (4x the median time) is not absorbed yet")
	}
	if got := perUnit(nil, []float64{10, 0, 5}, []float64{1, 1, 1}); got[0] != 0.1 || got[1] != 0 || got[2] != 0.2 {
		t.Errorf("perUnit = %v", got)
	}
}
