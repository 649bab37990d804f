//go:build !unix

package sync

import "net"

func peek(net.Conn) peekResult { return peekNone }

func fdLimit() int { return 0 }

func isFDLimit(error) bool { return false }
