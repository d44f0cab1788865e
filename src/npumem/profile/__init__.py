"""npumem's memory profiler: tracking, leaks, sampling, fragmentation, exporters and reports."""
