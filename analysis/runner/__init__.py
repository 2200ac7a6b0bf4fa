"""Many jobs of a store: the job plan, the result cache, Ray. The only analysis code that does I/O."""
