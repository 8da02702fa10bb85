"""The prefix cache below the KV cells: sequence states kept in host RAM (``ram``) and on disk
(``disk``), owned by the actor tree so that they outlive a batcher restart."""
