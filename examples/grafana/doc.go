// Package grafana holds dashboard.json, a Grafana dashboard of an
// elastictrain job over Prometheus (the workers' -metrics endpoints): world
// size, samples per second, goodput, recoveries and rounds, straggler
// reports and step time, per job (the elastictrain_job label). Import it in
// Grafana (Dashboards > New > Import) and pick the Prometheus data source.
// The package's test checks that every metric the dashboard queries is one
// the trainer exports under that name.
package grafana
