//go:build !race

package session

// raceDetector: the tests run under the race detector, ten times slower.
const raceDetector = false
