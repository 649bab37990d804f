package trainer

import (
	"io"

	"github.com/elastictrain/elastictrain/trainer/audit"
)

// Audit records which sample indices became part of the model's history.
//
// Deprecated: use audit.Recorder, the same type.
type Audit = audit.Recorder

// AuditEntry is one line of an audit log.
//
// Deprecated: use audit.Entry, the same type.
type AuditEntry = audit.Entry

// MemoryAudit is an Audit kept in memory.
//
// Deprecated: use audit.Memory, the same type.
type MemoryAudit = audit.Memory

// FileAudit is an Audit that appends JSON lines to a file.
//
// Deprecated: use audit.File, the same type.
type FileAudit = audit.File

// OpenFileAudit opens (creating or appending to) an audit log file.
//
// Deprecated: use audit.OpenFile.
func OpenFileAudit(path string) (*FileAudit, error) { return audit.OpenFile(path) }

// ReadAuditLog reads the entries of an audit log.
//
// Deprecated: use audit.ReadLog.
func ReadAuditLog(r io.Reader) ([]AuditEntry, error) { return audit.ReadLog(r) }

// AuditReport is VerifyAudit's result.
//
// Deprecated: use audit.Report, the same type.
type AuditReport = audit.Report

// VerifyAudit checks an audit log for exactly-once per epoch.
//
// Deprecated: use audit.Verify.
func VerifyAudit(entries []AuditEntry, epochs int, expected func(epoch int) []int) AuditReport {
	return audit.Verify(entries, epochs, expected)
}
