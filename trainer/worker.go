package trainer

import "github.com/elastictrain/elastictrain/worker"

var _ worker.Configurable = (*Config)(nil)

// ConfigureJob sets the job's part of c from the Settings its launcher
// hands the worker (launch.Worker.Configure calls it): JobID and
// Sync.Secret (a copy) when set; GracePeriod lowered to s.GracePeriod when
// c's is unset or longer (a shorter one is kept); Autoscale.Platform when
// s has one; Autoscale.Enabled when s.Autoscale; ShareCores when c's is 0.
// Everything else (world size bounds, epochs, checkpoints, the policy's
// knobs) stays c's.
func (c *Config) ConfigureJob(s worker.Settings) {
	if s.JobID != "" {
		c.JobID = s.JobID
	}
	if s.Secret != nil {
		c.Sync.Secret = append([]byte(nil), s.Secret...)
	}
	if g := s.GracePeriod; g > 0 && (c.GracePeriod <= 0 || c.GracePeriod > g) {
		c.GracePeriod = g
	}
	if s.Platform != nil {
		c.Autoscale.Platform = s.Platform
	}
	if s.Autoscale {
		c.Autoscale.Enabled = true
	}
	if s.ShareCores > 0 && c.ShareCores == 0 {
		c.ShareCores = s.ShareCores
	}
}
