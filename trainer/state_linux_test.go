package trainer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A directory where no file can be created is refused by NewLocalDir, not
// found at the first checkpoint. (/proc/self is such a directory even for
// root, whom permission bits do not stop; only Linux has it.)
func TestNewLocalDirRefusesAnUnwritableDirectory(t *testing.T) {
	_, err := NewLocalDir("/proc/self", 3)
	require.ErrorContains(t, err, "not writable")
}
