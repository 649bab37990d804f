package trainer_test

import (
	"os"
	"os/signal"
	"syscall"
)

func signalNotifyTerm(c chan os.Signal) { signal.Notify(c, syscall.SIGTERM) }
