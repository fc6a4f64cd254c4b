"""Fair dispatch between tenants: parked jobs, the elected dispatcher that releases them in
weighted fair order, and the capacity a batch runner may fill (docs/routing.md "Fair share")."""
