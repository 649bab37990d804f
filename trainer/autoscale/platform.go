package autoscale

import "github.com/elastictrain/elastictrain/worker"

// Platform enacts scaling decisions and says how many workers the platform
// allows.
//
// Deprecated: use worker.Platform, the same type (it moved below both the
// trainer and package launch, which implements it).
type Platform = worker.Platform
