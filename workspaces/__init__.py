"""Workspaces: tenancy, members and roles, resource flavors, cohorts and quotas."""
