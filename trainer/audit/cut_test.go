package audit

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func line(t *testing.T, e Entry) []byte {
	t.Helper()
	return append(appendAuditJSON(nil, e), '\n')
}

// A piece of a record cut at any byte, continued on its line by the next
// record another worker appended, is skipped wherever it lies in the log;
// so are several pieces in a row, and a record missing only its newline.
func TestReadLogSkipsRecordsCutShortInsideTheLog(t *testing.T) {
	first := Entry{Kind: "agreed", Gen: 9, Round: 1, Base: 0}
	cut := Entry{Kind: "step", Gen: 9, Round: 1, Rank: 1, Step: 51, Epoch: 2, Indices: []int{4, 17, 59999, 0, 123}}
	after := []Entry{
		{Kind: "step", Gen: 9, Round: 1, Rank: 2, Step: 51, Epoch: 2, Indices: []int{7, 8}},
		{Kind: "agreed", Gen: 9, Round: 2, Step: 50, Base: 0, Ended: true},
	}
	whole := line(t, cut)
	for k := 1; k < len(whole); k++ { // whole[:len-1] is the record without its newline
		var log bytes.Buffer
		log.Write(line(t, first))
		log.Write(whole[:k])
		log.Write(whole[:k/2+1]) // a second piece right after the first
		for _, e := range after {
			log.Write(line(t, e))
		}
		got, err := ReadLog(&log)
		require.NoError(t, err, "cut after %d bytes: %q", k, whole[:k])
		require.Equal(t, append([]Entry{first}, after...), got, "cut after %d bytes", k)
	}
}

// What no crash leaves is still an error, and names its line.
func TestReadLogRefusesMalformedLines(t *testing.T) {
	good := string(line(t, Entry{Kind: "step", Gen: 1, Round: 1, Step: 3, Indices: []int{1}}))
	for name, bad := range map[string]string{
		"garbage before a record":       `xyz` + good,
		"garbage after a record":        strings.TrimSuffix(good, "\n") + "junk\n",
		"a whole value then garbage":    `{"kind":"step"} junk` + good,
		"a piece that is not a prefix":  `{"kind":"step",]` + good,
		"a record of the wrong type":    `{"kind":"step","gen":"x"}` + "\n",
		"a line with no record at all":  "{}{}\n",
		"a piece and no record after":   `{"kind":"step","gen":1` + "\n",
		"a record then a piece, no end": strings.TrimSuffix(good, "\n") + `{"kind":"st` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ReadLog(strings.NewReader(good + bad + good))
			require.ErrorContains(t, err, "audit log line 2", "log %q", bad)
			require.Len(t, got, 1, "the lines before it are returned")
		})
	}
}

// TestHelperAuditWriter is the worker of TestReadLogAfterAWriterIsKilledMidWrite
// (a re-exec of the test binary), inert unless AUDIT_HELPER_LOG is set: it
// appends the same large record to a log opened by OpenFile for ever, one
// write each as File makes, printing "ready" after the first.
func TestHelperAuditWriter(t *testing.T) {
	path := os.Getenv("AUDIT_HELPER_LOG")
	if path == "" {
		return
	}
	f, err := OpenFile(path)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	// The bytes File.RecordStep writes, encoded once: the kill should land
	// in the write, not in the encoding.
	rec := append(appendAuditJSON(nil, bigStep()), '\n')
	for n := 0; ; n++ {
		if _, err := f.f.Write(rec); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		if n == 0 {
			fmt.Println("ready")
		}
	}
}

// bigStep is a record of many pages, so that a SIGKILL often lands while
// the kernel copies it into the file.
func bigStep() Entry {
	e := Entry{Kind: "step", Gen: 5, Round: 1, Rank: 1, Step: 7, Epoch: 1, Indices: make([]int, 1<<18)}
	for i := range e.Indices {
		e.Indices[i] = 1_000_000 + i
	}
	return e
}

// A worker SIGKILLed while it appends a record can leave part of it in the
// file (Linux ends a write at a page boundary on a fatal signal), and the
// others go on appending after it. ReadLog still reads the log: every
// whole record of the killed worker and every record appended after the
// piece. The worker is killed until a kill lands mid-write (most do).
func TestReadLogAfterAWriterIsKilledMidWrite(t *testing.T) {
	whole := len(line(t, bigStep()))
	for try := 1; ; try++ {
		path := filepath.Join(t.TempDir(), "audit.jsonl")
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAuditWriter$", "-test.count=1")
		cmd.Env = append(os.Environ(), "AUDIT_HELPER_LOG="+path)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		ready, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "ready\n", ready)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()

		st, err := os.Stat(path)
		require.NoError(t, err)
		kept := int(st.Size()) / whole
		cutShort := int(st.Size())%whole != 0

		f, err := OpenFile(path)
		require.NoError(t, err)
		later := []Entry{
			{Kind: "step", Gen: 5, Round: 1, Rank: 0, Step: 8, Epoch: 1, Indices: []int{1, 2, 3}},
			{Kind: "agreed", Gen: 5, Round: 2, Step: 7},
		}
		require.NoError(t, f.RecordStep(later[0]))
		require.NoError(t, f.RecordAgreed(later[1]))
		require.NoError(t, f.Close())

		r, err := os.Open(path)
		require.NoError(t, err)
		got, err := ReadLog(r)
		require.NoError(t, r.Close())
		require.NoError(t, err, "try %d: %d whole records, cut short: %v", try, kept, cutShort)
		require.Len(t, got, kept+len(later))
		for _, e := range got[:kept] {
			require.Equal(t, bigStep(), e)
		}
		require.Equal(t, later, got[kept:])
		if cutShort {
			t.Logf("try %d: the kill left a piece after %d whole records", try, kept)
			return
		}
		require.Less(t, try, 40, "no kill of 40 landed mid-write")
	}
}
