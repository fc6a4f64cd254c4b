-- Nothing past the fence (lua/fence.lua): whether this runner still holds the lease.
return 1
