package monitor

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/launch"
)

func TestEpochStepsPerSecondAndMeanWorldSize(t *testing.T) {
	s := Summary{Steps: []StepSeen{
		{Step: 1, Epoch: 0, WorldSize: 3, At: 10},
		{Step: 2, Epoch: 0, WorldSize: 3, At: 11}, // 1 s at 3
		{Step: 3, Epoch: 0, WorldSize: 3, At: 12}, // 1 s at 3
		{Step: 4, Epoch: 1, WorldSize: 1, At: 14}, // 2 s at 1
		{Step: 5, Epoch: 1, WorldSize: 1, At: 14.5},
		{Step: 6, Epoch: 1, WorldSize: 1, At: 15},
		{Step: 7, Epoch: 1, WorldSize: 1, At: 15.5}, // 1.5 s at 1
		{Step: 8, Epoch: 2, WorldSize: 2, At: 16.5}, // 1 s at 2, one step only in epoch 2
	}}
	// Epoch 0: 2 steps after its first over 2 s; epoch 1: 3 over 1.5 s;
	// epoch 2: a single step has no rate.
	require.Equal(t, []float64{1, 2, 0}, s.EpochStepsPerSecond())
	require.InDelta(t, (3*2+1*3.5+2*1)/6.5, s.MeanWorldSize(), 1e-12)
	require.Empty(t, Summary{}.EpochStepsPerSecond())
	require.Zero(t, Summary{Steps: s.Steps[:1]}.MeanWorldSize())
}

func TestScalingEventsRoundTrip(t *testing.T) {
	ev := launch.Event{Ev: launch.EvScaling, Step: 40, From: 2, To: 3, Reason: "probe"}
	b, err := json.Marshal(ev)
	require.NoError(t, err)
	require.JSONEq(t, `{"ev":"scaling","worker":0,"pid":0,"rank":0,"step":40,"from":2,"to":3,"reason":"probe","at":0}`, string(b))
	var back launch.Event
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, ev, back)
	sc, err := json.Marshal(ScalingSeen{Step: 40, From: 2, To: 3, Reason: "probe"})
	require.NoError(t, err)
	require.JSONEq(t, `{"step":40,"from":2,"to":3,"reason":"probe"}`, string(sc))
}
