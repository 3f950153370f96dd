"""Developer tools for aotgrad: sweeps and reports that are not part of the package."""
