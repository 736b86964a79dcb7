package clusterpool

import "time"

// SetRetryBackoff shortens the retry backoff for tests.
func SetRetryBackoff(c *Controller, min, max time.Duration) { c.retryMin, c.retryMax = min, max }
