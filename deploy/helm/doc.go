// Package helm holds sluice's Helm chart (the directory sluice/) and the
// tests that render it with Helm's library, lint it strictly and decode
// every rendered object into its Go type.
package helm
