"""One router module per resource: samples, centroids, assign, stats, health."""
