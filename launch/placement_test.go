package launch

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The first workers take the namespaces in list order; a later one goes
// where the fewest live workers are, the first such in list order, and a
// worker that exited frees its place.
func TestNetnsPlacesLaterWorkersWhereFewestRun(t *testing.T) {
	n, err := ParseNetns(" a, b ,c,")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, n.Spaces())
	require.Equal(t, []string{"ip", "netns", "exec", "a"}, n.Wrap(0))
	require.Equal(t, "b", n.Place(1))
	require.Equal(t, "c", n.Place(2))
	require.Equal(t, "a", n.Place(3)) // all hold one: the first
	require.Equal(t, "b", n.Place(4)) // a holds two
	n.Exited(Exit{Process: Process{Worker: 2}})
	require.Equal(t, "c", n.Place(5)) // c is empty now
	require.Equal(t, "b", n.Place(1)) // a restart of an index in the list stays put
}

func TestNetnsRefusesNoOrBadNames(t *testing.T) {
	n, err := ParseNetns(" , ")
	require.NoError(t, err)
	require.Nil(t, n)
	_, err = NewNetns(nil)
	require.ErrorIs(t, err, ErrNoNamespace)
	_, err = NewNetns([]string{"ok", "a/b"})
	require.ErrorContains(t, err, `"a/b" is not a network namespace name`)
}
