"""Stage 1-2: from a user call to fakes (inputs), what eager does (analysis, pure), and the joint
or inference graph traced from it (joint, pure), with its passes (cse), stale saved values (stale)
and the outputs their own eager node saved (own_saves)."""
