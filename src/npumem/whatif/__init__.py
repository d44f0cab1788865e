"""What if: recordings replayed through allocators under other settings, capacities and batch
sizes. Above the allocators (alloc) and the file formats (trace), which it drives and reads."""
